"""`surge serve --launcher static` on the netns cluster: agents started by the test in their
own network namespaces (as a StatefulSet's pods would be), each listening on its namespace's
address; the controller, in the root namespace, joins them over mutual TLS, serves greedy text
equal to a local run, and joins again an agent its owner restarted. An agent holding a
certificate of another CA, or another token, is refused with one clear line on both sides.
Removes every namespace and process it made (processes by PID)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from surge.runtime.launch import netns
from tests.conftest import REPO, run_surge
from tests.control.conftest import start_serve
from tests.control.test_serve_openai import GREEDY, MODEL, wait_for
from tests.control.test_static import TOKEN, stop_by_pid
from tests.runtime.conftest import needs_netns

PORT = 7070
"""Every agent listens on the same port: each has its own namespace, as pods do."""


def tls_args(pki: Path, who: str) -> list[str]:
    return ["--tls-cert", str(pki / f"{who}.pem"), "--tls-key", str(pki / f"{who}.key"),
            "--tls-ca", str(pki / "ca.pem")]  # fmt: skip


def start_agent(
    nn: netns.NodeNet, node: int, tmp: Path, registry: Path, token_file: Path, tls: list[str]
) -> tuple[subprocess.Popen, Path]:
    """`surge node run` inside `nn`'s namespace; its stderr goes to a file the test reads."""
    argv = ["ip", "netns", "exec", nn.netns, sys.executable, "-m", "surge.cli", "node", "run"]
    argv += ["--node-id", str(node), "--host", nn.address, "--port", str(PORT)]
    argv += ["--disk-dir", str(tmp / f"disk{node}"), "--remote-dir", str(registry)]
    argv += ["--token-file", str(token_file), "--cluster-id", f"sn{os.getpid() % 10000}"]
    argv += ["--no-preload-engine", *tls]
    env = {k: v for k, v in os.environ.items() if k != "SURGE_TOKEN"}
    err = tmp / f"agent{node}-{time.monotonic_ns()}.log"
    with err.open("w") as f:  # `ip netns exec` execs the agent: the PID is the agent's
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=f, text=True, env=env,
                                cwd=REPO)  # fmt: skip
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline() or "{}")
    assert ready.get("port") == PORT, err.read_text()[-2000:]
    return proc, err


def refusal_lines(log: Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if "refus" in ln.lower()]


@needs_netns
@pytest.mark.timeout(420)
def test_static_agents_in_namespaces_join_over_tls_and_strangers_are_refused(
    tmp_path, surge_home, tiny_store_dir, reference
):
    import openai

    for name, members in (("pki", "controller,agent"), ("other", "agent")):
        run = run_surge("node", "certs", str(tmp_path / name), "--members", members)
        if run.returncode != 0 and "openssl" in run.stderr:
            pytest.skip("needs openssl for the TLS files")
        assert run.returncode == 0, run.stderr
    pki, other = tmp_path / "pki", tmp_path / "other"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    wrong_token = tmp_path / "wrong-token"
    wrong_token.write_text("another-cluster-token-987654\n")
    registry = tmp_path / "state" / "registry"  # start_serve's state dir: the shared path
    prefix = netns.new_prefix()
    agents: list[subprocess.Popen] = []
    try:
        net = netns.free_subnet(os.getpid())
        bridge = netns.add_bridge(prefix, net)
        nodes = [netns.add_node(prefix, bridge, net, i) for i in range(3)]
        started = [start_agent(nodes[n], n, tmp_path, registry, token_file,
                               tls_args(pki, "agent")) for n in (0, 1)]  # fmt: skip
        agents += [p for p, _ in started]
        listed = ",".join(f"{nodes[n].address}:{PORT}" for n in (0, 1))
        config = {"deployments": [{"name": MODEL, "model": str(tiny_store_dir)}]}
        s = start_serve(tmp_path, surge_home, config, "--launcher", "static", "--agents", listed,
                        "--token-file", str(token_file), *tls_args(pki, "controller"))  # fmt: skip
        try:
            seen = s.http.get("/v1/nodes").json()["data"]
            assert [(n["up"], n["address"][0]) for n in seen] == [
                (True, nodes[0].address),
                (True, nodes[1].address),
            ]
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
            out = c.completions.create(model=MODEL, prompt="Pods", max_tokens=8, **GREEDY)
            assert out.choices[0].text == reference("Pods", 8)
            # The pod of agent 1 restarts in its namespace: the controller joins it again.
            stop_by_pid(agents[1:2])
            proc, _ = start_agent(nodes[1], 1, tmp_path, registry, token_file,
                                  tls_args(pki, "agent"))  # fmt: skip
            agents[1] = proc
            up = lambda: all(n["up"] for n in s.http.get("/v1/nodes").json()["data"])  # noqa: E731
            wait_for(up, 120, "agent 1 to rejoin")
            out = c.completions.create(model=MODEL, prompt="Again", max_tokens=8, **GREEDY)
            assert out.choices[0].text == reference("Again", 8)
        finally:
            s.stop()
        assert [a.poll() for a in agents] == [None, None]  # the agents are not its to stop

        # Strangers: an agent of another CA, then one with another token, in namespace 2.
        env = {**os.environ, "SURGE_HOME": str(surge_home)}
        env.pop("SURGE_TOKEN", None)
        for tls, token in (
            (tls_args(other, "agent"), token_file),
            (tls_args(pki, "agent"), wrong_token),
        ):
            stranger, log = start_agent(nodes[2], 2, tmp_path, registry, token, tls)
            agents.append(stranger)
            run = subprocess.run(
                [sys.executable, "-m", "surge.cli", "serve", "--port", "0", "--launcher",
                 "static", "--agents", f"{nodes[2].address}:{PORT}", "--agents-timeout", "5",
                 "--token-file", str(token_file), *tls_args(pki, "controller"),
                 "--state-dir", str(tmp_path / "s2")],
                capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
            )  # fmt: skip
            errors = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]
            assert run.returncode == 2, run.stderr[-2000:]
            assert len(errors) == 1 and nodes[2].address in errors[0], run.stderr[-2000:]
            assert "Traceback" not in run.stderr
            assert len(refusal_lines(log)) >= 1, log.read_text()[-2000:]
            assert "Traceback" not in log.read_text()
            stop_by_pid([stranger])
    finally:
        stop_by_pid(agents)
        netns.remove_all(prefix)
    assert netns.resources(prefix) == []
