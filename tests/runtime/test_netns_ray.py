"""Ray across network namespaces: a Ray head in one namespace, a worker in another, and
`surge serve --launcher ray --agent-host node-ip` on the head (one agent per Ray node, each on
its namespace's address). Removes every namespace and Ray process it made."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from surge.runtime.launch import netns
from tests.conftest import REPO
from tests.control.conftest import (  # noqa: F401 (fixtures of surge serve)
    reference,
    surge_home,
    tiny_store_dir,
)
from tests.runtime.conftest import needs_netns


@needs_netns
@pytest.mark.timeout(300)
def test_serve_with_ray_across_namespaces(tmp_path, surge_home, tiny_store_dir, reference) -> None:  # noqa: F811
    """A Ray head in one namespace, a Ray worker in another; `surge serve --launcher ray
    --ray-address` on the head places one agent per Ray node, each on its node's address."""
    import secrets
    import shutil
    import tempfile

    import httpx
    import yaml

    pytest.importorskip("ray", reason="ray is not installed (pip install 'surge[ray]')")
    ray_bin = str(Path(sys.executable).parent / "ray")
    prefix = netns.new_prefix()
    ray_tmp = tempfile.mkdtemp(prefix="sgray")  # short: Ray's socket paths must fit 107 bytes
    env = {
        **os.environ,
        "SURGE_HOME": str(surge_home),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    serve = None
    try:
        net = netns.free_subnet(os.getpid())
        bridge = netns.add_bridge(prefix, net)
        nodes = [netns.add_node(prefix, bridge, net, i) for i in range(2)]
        head = nodes[0].address

        def in_node(node: int, *cmd: str) -> list[str]:
            return ["ip", "netns", "exec", nodes[node].netns, *cmd]

        ray = [ray_bin, "start", "--num-cpus", "2", "--disable-usage-stats"]
        subprocess.run(
            in_node(0, *ray, "--head", "--node-ip-address", head, "--port", "6379",
                    "--include-dashboard", "false", "--temp-dir", ray_tmp),
            env=env, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        subprocess.run(
            in_node(1, *ray, "--address", f"{head}:6379", "--node-ip-address", nodes[1].address),
            env=env, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        # Namespaces of this machine: frames in clear are fine here (else TLS is required).
        config = {"nodes": 2, "deployments": [{"name": "tiny", "model": str(tiny_store_dir)}]}
        config["allow_plain"] = True
        (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "surge.cli", "serve", "--port", "0", "--host", head]
        cmd += ["--config", str(tmp_path / "serve.yaml"), "--state-dir", str(tmp_path / "s")]
        cmd += ["--launcher", "ray", "--ray-address", f"{head}:6379", "--agent-host", "node-ip"]
        log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 (the process keeps it open)
        serve = subprocess.Popen(
            in_node(0, *cmd), stdout=subprocess.PIPE, stderr=log, env=env, cwd=REPO, text=True
        )
        log.close()
        line = ""
        while not line.startswith("{"):
            line = serve.stdout.readline()
            assert line, "surge serve exited: " + (tmp_path / "serve.log").read_text()[-2000:]
        url = json.loads(line)["url"]
        with httpx.Client(base_url=url, timeout=120) as http:
            agents = http.get("/v1/nodes").json()["data"]
            assert sorted(a["address"][0] for a in agents) == [head, nodes[1].address]
            body = {"model": "tiny", "prompt": "Ray says", "max_tokens": 8, "temperature": 0}
            out = http.post("/v1/completions", json={**body, "ignore_eos": True})
            assert out.json()["choices"][0]["text"] == reference("Ray says", 8)
    finally:
        if serve is not None:
            serve.send_signal(signal.SIGINT)
            try:
                serve.wait(30)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait(10)
            serve.stdout.close()
        netns.remove_all(prefix)  # kills the Ray processes in the namespaces
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert netns.resources(prefix) == []
