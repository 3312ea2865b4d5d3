"""`surge serve --launcher static`: agents started by the test (as a StatefulSet would) with
`surge node run`, the token from a file, TLS on; the controller joins them, serves greedy
text equal to a local run, joins again an agent its owner restarted, and leaves them
running when it stops (they are stopped here, by PID). Agents that never answer are named
in one error line, not waited on forever."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_surge
from tests.control.conftest import start_serve
from tests.control.test_serve_openai import GREEDY, MODEL

TOKEN = "static-cluster-token-0123456789"


def start_agent(
    node: int, tmp: Path, registry: Path, token_file: Path, tls: list[str], port: int = 0
):
    argv = [sys.executable, "-m", "surge.cli", "node", "run", "--node-id", str(node)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--disk-dir", str(tmp / f"disk{node}")]
    argv += ["--remote-dir", str(registry), "--token-file", str(token_file)]
    argv += ["--cluster-id", f"st{os.getpid() % 10000}", "--no-preload-engine", *tls]
    env = {k: v for k, v in os.environ.items() if k != "SURGE_TOKEN"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)


def stop_by_pid(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
        if p.stdout:
            p.stdout.close()


@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for the TLS files")
def test_serve_joins_agents_started_elsewhere_over_tls(
    tmp_path, surge_home, tiny_store_dir, reference
):
    import openai

    pki = tmp_path / "pki"
    run = run_surge("node", "certs", str(pki), "--members", "controller,agent")
    assert run.returncode == 0, run.stderr
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    tls = lambda who: ["--tls-cert", str(pki / f"{who}.pem"), "--tls-key",  # noqa: E731
                       str(pki / f"{who}.key"), "--tls-ca", str(pki / "ca.pem")]  # fmt: skip
    registry = tmp_path / "state" / "registry"  # the controller's (start_serve's state dir)
    agents = [start_agent(n, tmp_path, registry, token_file, tls("agent")) for n in (0, 1)]
    try:
        ports = [json.loads(a.stdout.readline())["port"] for a in agents]
        config = {"deployments": [{"name": MODEL, "model": str(tiny_store_dir)}]}
        listed = ",".join(f"127.0.0.1:{p}" for p in ports)
        s = start_serve(tmp_path, surge_home, config, "--launcher", "static", "--agents", listed,
                        "--token-file", str(token_file), *tls("controller"))  # fmt: skip
        try:
            nodes = s.http.get("/v1/nodes").json()["data"]
            assert [(n["up"], n["address"][1]) for n in nodes] == [(True, p) for p in ports]
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
            out = c.completions.create(model=MODEL, prompt="Static", max_tokens=8, **GREEDY)
            assert out.choices[0].text == reference("Static", 8)
            # Agent 1 goes away and its owner starts it again (a pod restart): it rejoins.
            stop_by_pid(agents[1:])
            agents[1] = start_agent(1, tmp_path, registry, token_file, tls("agent"), ports[1])
            assert json.loads(agents[1].stdout.readline())["port"] == ports[1]
            deadline = time.monotonic() + 90
            while not all(n["up"] for n in s.http.get("/v1/nodes").json()["data"]):
                assert time.monotonic() < deadline, "agent 1 did not rejoin"
                time.sleep(0.5)
            out = c.completions.create(model=MODEL, prompt="Again", max_tokens=8, **GREEDY)
            assert out.choices[0].text == reference("Again", 8)
        finally:
            s.stop()
        # The agents belong to whoever started them: the controller left them running.
        assert [a.poll() for a in agents] == [None, None]
    finally:
        stop_by_pid(agents)
    assert [a.returncode for a in agents] == [0, 0]


def test_agents_that_never_answer_are_named_in_one_error(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    env = {**os.environ, "SURGE_TOKEN": TOKEN, "SURGE_HOME": str(tmp_path)}
    run = run_surge("serve", "--launcher", "static", "--agents", f"127.0.0.1:{dead}",
                    "--agents-timeout", "1", "--port", "0", "--state-dir", str(tmp_path / "s"),
                    env=env, timeout=60)  # fmt: skip
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("error: 0 of 1 agents answered in time")
    assert f"127.0.0.1:{dead} (Connection refused)" in line


@pytest.mark.parametrize(
    ("args", "env_token", "message"),
    [
        (["--agents", "nohost"], TOKEN, "--agents entries must be HOST:PORT"),
        ([], TOKEN, "--launcher static needs --agents"),
        (["--agents", "127.0.0.1:1"], None, "set SURGE_TOKEN (or give --token-file)"),
        (["--agents", "127.0.0.1:1"], "short", "use at least 16"),
        (["--agents", "127.0.0.1:1", "--tls-cert", "c.pem"], TOKEN, "missing --tls-key, --tls-ca"),
    ],
)
def test_static_settings_are_checked_before_anything_starts(tmp_path, args, env_token, message):
    env = {k: v for k, v in os.environ.items() if k != "SURGE_TOKEN"}
    if env_token:
        env["SURGE_TOKEN"] = env_token
    run = run_surge("serve", "--launcher", "static", *args, "--port", "0",
                    "--state-dir", str(tmp_path / "s"), env=env, timeout=60)  # fmt: skip
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line
