"""The transport under bad peers, corruption, failures and bandwidth caps."""

import asyncio
import contextlib
import itertools
import os
import socket
import struct
import time
from pathlib import Path

import pytest

from surge.model.importer import import_checkpoint
from surge.model.manifest import read_manifest
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import TinyModelConfig
from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
from surge.runtime.handshake import AuthError, connect
from surge.runtime.multicast import MulticastExecutor
from surge.runtime.node.transfer import GPU_DEVICE_NODES
from surge.runtime.protocol import BlockReply, ChecksumsOp, StatusOp, ok_header
from surge.runtime.token_bucket import TokenBucket
from surge.wire import encode_frame
from tests.runtime.conftest import MODEL, connected, first_block_at


@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_token_bucket_paces_to_its_rate() -> None:
    bucket = TokenBucket(10e6)  # 10 MB/s

    async def push() -> float:
        t = time.perf_counter()
        for _ in range(40):
            await bucket.consume(100_000)
        return time.perf_counter() - t

    took = asyncio.run(push())  # 4 MB at 10 MB/s, minus the 100 KB burst
    assert 0.36 <= took <= 0.6  # never faster than the cap; slack above for a busy machine


def test_wrong_token_is_refused_and_bad_peers_do_not_crash_the_agent(make_cluster) -> None:
    cluster = make_cluster(1)
    host, port = cluster.addresses[0]

    async def run() -> dict:
        with pytest.raises(AuthError, match="wrong cluster token"):
            await connect(host, port, "not-the-token", "intruder")
        # A peer that says half a hello and leaves.
        raw = socket.create_connection((host, port))
        raw.sendall(struct.pack(">I", 100) + b'{"kind": "hel')
        raw.close()
        # A peer that authenticates, then closes in the middle of a frame's payload.
        conn = await connect(host, port, cluster.token, "flaky")
        conn.sock.setblocking(True)
        head = b'{"op":"status","length":1000}'
        conn.sock.sendall(struct.pack(">I", len(head)) + head + b"x" * 10)
        conn.close()
        # Garbage that is not a frame at all.
        raw = socket.create_connection((host, port))
        raw.sendall(b"\xff" * 64)
        raw.close()
        await asyncio.sleep(0.2)
        client = cluster.client()
        await client.connect()
        try:
            return await client.call(0, StatusOp())
        finally:
            await client.close()

    status = asyncio.run(run())
    assert status.node == 0
    assert cluster.alive() == [0]


def test_corrupted_block_on_the_wire_is_detected_and_fetched_again(make_cluster, manifest) -> None:
    # Node 0 corrupts the first block it sends.
    cluster = make_cluster(3, extra_args={0: ["--fault-corrupt-sends", "1"]})

    async def run():
        client = await connected(cluster, manifest)
        try:
            out = plan_scale_out(MulticastRequest(num_nodes=3, num_blocks=manifest.num_blocks))
            result = await MulticastExecutor(client, MODEL, out.plan, timeout_s=60).run()
            return result, await client.broadcast(ChecksumsOp(model=MODEL))
        finally:
            await client.close()

    result, sums = asyncio.run(run())
    assert result.corrupt_refetches == 1 and result.complete_s is not None
    want = {b.index: b.checksum for b in manifest.blocks}
    assert all(s.checksums == want for s in sums.values())


def test_a_dead_agent_does_not_stop_the_others(make_cluster, manifest) -> None:
    num_nodes = 6
    # ~1 MB blocks at 0.05 Gbit/s: ~0.2 s per block; the kill lands at the victim's first
    # (a fixed 0.5 s could come before any byte on a slow start, or after the last block).
    cluster = make_cluster(num_nodes, link_gbps=0.05)
    out = plan_scale_out(MulticastRequest(num_nodes=num_nodes, num_blocks=manifest.num_blocks))
    victim = out.plan.steps[0][0].dst  # the first receiver forwards to others

    async def run():
        client = await connected(cluster, manifest)
        try:
            task = asyncio.create_task(
                MulticastExecutor(client, MODEL, out.plan, timeout_s=60).run()
            )
            await first_block_at(client, victim)  # it has blocks to pass on still
            assert not task.done()
            await asyncio.to_thread(cluster.kill, victim)
            result = await task
            alive = [n for n in range(num_nodes) if n != victim]
            return result, await client.broadcast(ChecksumsOp(model=MODEL), alive)
        finally:
            await client.close()

    result, sums = asyncio.run(run())
    assert result.dead_nodes == [victim]
    assert result.complete_s is not None, "the surviving nodes did not finish"
    assert result.replans, "deliveries from the dead node were not re-planned"
    want = {b.index: b.checksum for b in manifest.blocks}
    assert all(s.checksums == want for s in sums.values())


def test_agents_that_only_move_bytes_never_import_torch(make_cluster, manifest) -> None:
    """`preload_engine` off on a machine with no GPU: wiring the peers (whose hello says
    whether the device is shared), registering a model and loading it to the host tier leave
    torch unimported in every agent (~2 s of CPU each; 8c934c3's hello imported it, and a
    6-agent test spent ~20 s of wall in it at load 13)."""
    if any(map(os.path.exists, GPU_DEVICE_NODES)):
        pytest.skip("a GPU machine: the hello asks torch whether the device is shared")
    cluster = make_cluster(2)

    async def run() -> None:
        client = await connected(cluster, manifest)
        await client.close()

    asyncio.run(run())
    for node, proc in cluster.procs.items():
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "libtorch" not in maps, f"agent {node} imported torch"


@pytest.fixture(scope="module")
def one_block_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A registry with one ~17 MB block, for timing a capped transfer."""
    root = tmp_path_factory.mktemp("big")
    cfg = TinyModelConfig(
        num_layers=1,
        hidden_size=512,
        intermediate_size=1536,
        num_heads=8,
        num_kv_heads=8,
        vocab_size=1024,
    )
    create_tiny_model(root / "hf", cfg)
    import_checkpoint(root / "hf", root / "reg" / MODEL, num_blocks=1, progress=False)
    return root / "reg"


@pytest.mark.parametrize(
    ("egress_gbps", "ingress_gbps"), [((0.2, 0.2), (0.2, 0.2)), ((0.4, 0.4), (0.1, 0.1))]
)
@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_bandwidth_caps_hold_within_15_percent(
    make_cluster,
    one_block_registry: Path,
    egress_gbps,
    ingress_gbps,
) -> None:
    manifest = read_manifest(one_block_registry / MODEL)
    cluster = make_cluster(
        2, remote_dir=one_block_registry, egress_gbps=egress_gbps, ingress_gbps=ingress_gbps
    )

    async def run():
        client = await connected(cluster, manifest)
        try:
            out = plan_scale_out(MulticastRequest(num_nodes=2, num_blocks=1))
            return await MulticastExecutor(client, MODEL, out.plan, timeout_s=60).run()
        finally:
            await client.close()

    result = asyncio.run(run())
    rate_bytes_per_s = min(egress_gbps[0], ingress_gbps[1]) * 1e9 / 8
    expected_s = manifest.total_bytes / rate_bytes_per_s
    assert result.complete_s == pytest.approx(expected_s, rel=0.15)


@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_wait_sent_holds_until_the_peer_has_the_bytes() -> None:
    """`send` returns once the kernel took a frame; `wait_sent` returns only once the peer
    has it (the agent's egress port is busy until then, so two sends never share a link)."""
    from surge.runtime.transport import Connection, unsent_bytes

    async def run() -> tuple[int, float, int, float]:
        listener = socket.create_server(("127.0.0.1", 0))
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
        listener.close()
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        conn = Connection(a)
        try:
            # Blocked by a peer that does not read, the send leaves bytes in the socket.
            payload = bytes(1 << 20)
            header = ok_header(BlockReply(model="m", block=0))
            sending = asyncio.create_task(conn.send(header, payload[: 512 << 10]))
            await asyncio.sleep(0.2)
            left = unsent_bytes(a)
            t = time.monotonic()
            await conn.wait_sent(0, None, timeout_s=0.3)  # still unread: gives up at 0.3 s
            gave_up_s = time.monotonic() - t

            stop = asyncio.Event()

            async def drain() -> None:  # reads whatever comes until told to stop
                b.setblocking(False)
                loop = asyncio.get_running_loop()
                buf = bytearray(1 << 16)
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(loop.sock_recv_into(b, buf), 0.05)

            reader = asyncio.create_task(drain())
            await asyncio.wait_for(sending, 10)
            t = time.monotonic()
            await conn.wait_sent(0, None, timeout_s=10)
            waited_s = time.monotonic() - t
            after = unsent_bytes(a)
            stop.set()
            await reader
            return left, gave_up_s, after, waited_s
        finally:
            conn.close()
            b.close()

    left, gave_up_s, after, waited_s = asyncio.run(run())
    assert left > 64 << 10  # the kernel held much of the frame while the peer read nothing
    assert 0.29 <= gave_up_s < 2.0
    assert after == 0 and waited_s < 5.0


@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_a_trickling_payload_wakes_the_reader_per_low_water_mark_not_per_packet() -> None:
    """A payload arriving a few KB at a time (a slow link) is read in a few large pieces:
    the socket's low-water mark is the rest of the frame, at most `RECV_LOWAT_BYTES`. A
    payload's last bytes, fewer than the mark, still arrive, and the next header is read
    as soon as it is there (the mark is back at one byte)."""
    from surge.runtime.security.channel import RECV_LOWAT_BYTES
    from surge.runtime.transport import Connection

    payload_bytes, piece_bytes = RECV_LOWAT_BYTES * 3 + 12_345, 8 << 10

    async def run() -> tuple[int, bytes, int, float]:
        listener = socket.create_server(("127.0.0.1", 0))
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
        listener.close()
        conn = Connection(b)
        loop = asyncio.get_running_loop()
        real_recv_into = loop.sock_recv_into
        calls = 0

        async def counting_recv_into(sock: socket.socket, view: memoryview) -> int:
            nonlocal calls
            calls += 1
            return await real_recv_into(sock, view)

        loop.sock_recv_into = counting_recv_into  # type: ignore[method-assign]
        try:
            payload = bytes(range(256)) * (payload_bytes // 256) + b"z" * (payload_bytes % 256)
            frame = encode_frame(ok_header(BlockReply(model="m", block=0)), payload)
            receiving = asyncio.create_task(conn.recv())
            for start in range(0, len(frame), piece_bytes):  # ~8 KB every 0.2 ms
                a.sendall(frame[start : start + piece_bytes])
                await asyncio.sleep(0.0002)
            _, got = await asyncio.wait_for(receiving, 10)
            payload_calls = calls
            # The next frame's header is read at once, not held back by the mark.
            t = time.monotonic()
            second = asyncio.create_task(conn.recv())
            await asyncio.sleep(0.05)
            a.sendall(encode_frame(ok_header(BlockReply(model="m", block=1))))
            await asyncio.wait_for(second, 5)
            return payload_calls, bytes(got), conn.channel.lowat.num_bytes, time.monotonic() - t
        finally:
            loop.sock_recv_into = real_recv_into  # type: ignore[method-assign]
            conn.close()
            a.close()

    payload_calls, got, lowat_after, second_s = asyncio.run(run())
    assert got == bytes(range(256)) * (payload_bytes // 256) + b"z" * (payload_bytes % 256)
    # Without the mark the reader wakes per piece (~100 times); with it, about once per
    # mark's worth (4 here) plus the header's reads and a partial first read or two.
    assert payload_calls <= 12, payload_calls
    assert lowat_after == 1
    assert second_s < 1.0


def test_chunk_observer_sees_every_read_of_a_payload_at_its_offset() -> None:
    """`recv(on_chunk=...)` reports each read as it lands, covering the payload in order
    (what `RunningChecksum` sums while a block arrives), and only the payload."""
    from surge.runtime.transport import Connection

    async def run() -> tuple[list[tuple[int, int]], bytes, bytes]:
        listener = socket.create_server(("127.0.0.1", 0))
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
        listener.close()
        conn = Connection(b)
        seen: list[tuple[int, int]] = []
        copied = bytearray()

        def observe(chunk: memoryview, offset: int) -> None:
            seen.append((offset, len(chunk)))
            copied.extend(chunk)

        try:
            payload = os.urandom(700_000)
            frame = encode_frame(ok_header(BlockReply(model="m", block=0)), payload)
            receiving = asyncio.create_task(conn.recv(on_chunk=observe))
            for start in range(0, len(frame), 100_000):
                a.sendall(frame[start : start + 100_000])
                await asyncio.sleep(0.002)
            _, got = await asyncio.wait_for(receiving, 10)
            return seen, bytes(got), bytes(copied)
        finally:
            conn.close()
            a.close()

    seen, got, copied = asyncio.run(run())
    assert copied == got and len(got) == 700_000
    assert seen[0][0] == 0 and len(seen) > 1
    assert all(o2 == o1 + n1 for (o1, n1), (o2, _) in itertools.pairwise(seen))
