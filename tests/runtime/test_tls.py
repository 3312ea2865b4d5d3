"""TLS between the controller and agents, and between agents; the token never on the wire.

Certificates are made by the test in a tmp dir with `surge node certs` (the openssl
command); the tests skip, saying why, where openssl is absent."""

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from surge.errors import SurgeError
from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
from surge.runtime.handshake import AuthError, accept_hello, connect
from surge.runtime.multicast import MulticastExecutor
from surge.runtime.protocol import ChecksumsOp, StatusOp
from surge.runtime.security.tls import TlsConfig
from surge.runtime.transport import Connection
from surge.wire import HEADER_LEN, parse_header
from tests.runtime.conftest import MODEL, connected

# One xdist worker runs every test here: the module's `pki` (two `surge node certs` runs) is then
# made once, not once on each worker that draws one of its tests.
pytestmark = [
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
    pytest.mark.xdist_group("tls"),
]


def make_certs(out: Path, members: str) -> None:
    argv = [sys.executable, "-m", "surge.cli", "node", "certs", str(out), "--members", members]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsConfig]:
    """Members of the cluster CA (`agent`, `controller`) and of another CA (`stranger`)."""
    ours, theirs = tmp_path_factory.mktemp("ca"), tmp_path_factory.mktemp("other-ca")
    make_certs(ours, "agent,controller")
    make_certs(theirs, "stranger")

    def member(d: Path, name: str) -> TlsConfig:
        return TlsConfig(d / f"{name}.pem", d / f"{name}.key", d / "ca.pem")

    return {
        "agent": member(ours, "agent"),
        "controller": member(ours, "controller"),
        "stranger": member(theirs, "stranger"),
    }


def test_blocks_and_ops_flow_over_tls_and_strangers_are_refused(make_cluster, manifest, pki):
    cluster = make_cluster(3, tls=pki["agent"])
    host, port = cluster.addresses[0]

    async def run():
        client = await connected(cluster, manifest)  # controller <-> agents over TLS
        try:
            # Agent <-> agent over TLS: every block crosses two hops of a multicast.
            out = plan_scale_out(MulticastRequest(num_nodes=3, num_blocks=manifest.num_blocks))
            result = await MulticastExecutor(client, MODEL, out.plan, timeout_s=60).run()
            sums = await client.broadcast(ChecksumsOp(model=MODEL))
        finally:
            await client.close()
        ours = pki["controller"].load().client
        conn = await connect(host, port, cluster.token, "controller", tls=ours)
        assert (await conn.request(StatusOp().to_json()))[0]["node"] == 0
        conn.close()
        refusals = []
        for tls in (pki["stranger"].load().client, None):  # a wrong CA; no TLS at all
            with pytest.raises(AuthError) as e:
                await connect(host, port, cluster.token, "intruder", tls=tls, timeout_s=5)
            refusals.append(str(e.value))
        return result, sums, refusals

    result, sums, refusals = asyncio.run(run())
    assert result.complete_s is not None
    want = {b.index: b.checksum for b in manifest.blocks}
    assert all(s.checksums == want for s in sums.values())
    assert "TLS handshake" in refusals[0] or "refused our certificate" in refusals[0]
    assert "does it use TLS?" in refusals[1]
    assert cluster.alive() == [0, 1, 2]


def test_a_tls_client_does_not_trust_an_agent_of_another_ca(make_cluster, pki):
    cluster = make_cluster(1, tls=pki["stranger"])
    host, port = cluster.addresses[0]

    async def run() -> str:
        with pytest.raises(AuthError) as e:
            await connect(
                host, port, cluster.token, "controller", tls=pki["controller"].load().client
            )
        return str(e.value)

    assert "certificate verify failed" in asyncio.run(run())


def test_the_token_is_proven_never_sent(tmp_path):
    """What a client puts on a plain connection holds no trace of the token (the old hello
    carried it in clear)."""
    token = "s3cret-token-" + "x" * 20
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    port = listener.getsockname()[1]

    async def run() -> bytes:
        task = asyncio.create_task(connect("127.0.0.1", port, token, "controller", timeout_s=3))
        peer, _ = await asyncio.to_thread(listener.accept)
        peer.settimeout(3)
        prefix = await asyncio.to_thread(peer.recv, HEADER_LEN.size, socket.MSG_WAITALL)
        (n,) = HEADER_LEN.unpack(prefix)
        head = await asyncio.to_thread(peer.recv, n, socket.MSG_WAITALL)
        peer.close()
        with pytest.raises((AuthError, ConnectionError)):
            await task
        return prefix + head

    try:
        sent = asyncio.run(run())
    finally:
        listener.close()
    hello = parse_header(sent[HEADER_LEN.size :])
    assert hello["kind"] == "hello" and "nonce" in hello
    assert token.encode() not in sent and "token" not in hello


def test_tls_settings_name_what_is_missing_or_unreadable(tmp_path, pki):
    with pytest.raises(SurgeError, match="missing --tls-key, --tls-ca"):
        TlsConfig.from_options(tmp_path / "a.pem", None, None)
    with pytest.raises(SurgeError, match=r"--tls-cert .* does not exist"):
        TlsConfig(tmp_path / "no.pem", pki["agent"].key_path, pki["agent"].ca_path).load()
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(SurgeError, match=r"--tls-ca .* is not a PEM CA certificate"):
        TlsConfig(pki["agent"].cert_path, pki["agent"].key_path, junk).load()


def test_node_run_refuses_missing_tls_files_with_one_error_line(tmp_path):
    env = {"SURGE_TOKEN": "t" * 32, "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-m", "surge.cli", "node", "run", "--node-id", "0"]
    argv += ["--disk-dir", str(tmp_path), "--tls-cert", str(tmp_path / "missing.pem")]
    argv += ["--tls-key", str(tmp_path / "k"), "--tls-ca", str(tmp_path / "ca")]
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: --tls-cert {tmp_path / 'missing.pem'} does not exist; give a PEM file"
    ]


def test_a_trickling_tls_payload_arrives_whole(pki):
    """Bytes that come a few KB at a time leave partial TLS records inside OpenSSL, which
    neither the BIO nor `pending()` counts: the socket's low-water mark must not wait for
    them (it did: a frame's last bytes never woke the reader)."""
    ours = pki["agent"].load()
    payload = os.urandom(3 * (256 << 10) + 12_345)

    async def run() -> bytes:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        loop = asyncio.get_running_loop()
        client_task = asyncio.create_task(
            connect(*listener.getsockname(), "t" * 32, "sender", tls=ours.client)
        )
        sock, _ = await loop.sock_accept(listener)
        server = Connection(sock)
        await accept_hello(server, "t" * 32, "receiver", tls=ours.server)
        client = await client_task
        real_sendall = loop.sock_sendall

        async def trickle(s: socket.socket, data) -> None:
            view = memoryview(data).cast("B")
            for start in range(0, len(view), 5000):  # never on a record's edge
                await real_sendall(s, view[start : start + 5000])
                await asyncio.sleep(0.0002)

        loop.sock_sendall = trickle  # type: ignore[method-assign]
        try:
            out = b""
            for size in (len(payload), 70_000, 1_000):  # each waits for the one before
                receiving = asyncio.create_task(server.recv())
                await client.send({"kind": "block"}, payload[:size])
                _, got = await asyncio.wait_for(receiving, 10)
                out += bytes(got)
            return out
        finally:
            loop.sock_sendall = real_sendall  # type: ignore[method-assign]
            client.close()
            server.close()
            listener.close()

    assert asyncio.run(run()) == payload + payload[:70_000] + payload[:1_000]


def test_frames_in_clear_only_on_loopback_or_when_asked(tmp_path):
    from surge.cli.serve_cluster import cluster_settings

    env = {**os.environ, "SURGE_TOKEN": "t" * 32}
    argv = [sys.executable, "-m", "surge.cli", "node", "run", "--node-id", "0"]
    argv += ["--disk-dir", str(tmp_path), "--host", "192.0.2.7"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert (
        line.startswith("error: 192.0.2.7 is not loopback and TLS is off")
        and "--allow-plain" in line
    )
    # Ray agents on their nodes' addresses: TLS, or the config's allow_plain.
    with pytest.raises(SurgeError, match="node-ip is not loopback and TLS is off"):
        cluster_settings("ray", {"agent_host": "node-ip"}, {})
    assert cluster_settings("ray", {"agent_host": "node-ip"}, {"allow_plain": True}) == {
        "allow_plain": True
    }
    assert cluster_settings("ray", {}, {}) == {}  # a local Ray cluster on loopback


def test_certs_name_what_is_missing(tmp_path):
    argv = [sys.executable, "-m", "surge.cli", "node", "certs", str(tmp_path / "pki")]
    env = {**os.environ, "PATH": str(tmp_path)}  # no openssl on it
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: making certificates needs the openssl command: install openssl"
    ]
    out = subprocess.run([*argv, "--members", "a/b"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "a member name is letters, digits" in out.stderr
