"""`surge serve --cluster netns`: the controller's agents each in a network namespace of its
own (links shaped, the API on loopback), with and without GPU-time emulation; a bad
`--cluster` is one error line. Skipped where the machine cannot make namespaces."""

import subprocess
import sys

import pytest

from surge.runtime.launch import netns
from tests.conftest import REPO
from tests.control.conftest import (  # noqa: F401 (fixtures of surge serve)
    reference,
    start_serve,
    surge_home,
    tiny_store_dir,
)
from tests.runtime.conftest import needs_netns


@needs_netns
@pytest.mark.timeout(240)
def test_serve_on_a_netns_cluster(tmp_path, surge_home, tiny_store_dir, reference) -> None:  # noqa: F811
    import httpx

    config = {"nodes": 2, "deployments": [{"name": "tiny", "model": str(tiny_store_dir)}]}
    s = start_serve(tmp_path, surge_home, config, "--cluster", "netns", "--link-gbps", "1")
    try:
        nodes = s.http.get("/v1/nodes").json()["data"]
        assert [n["up"] for n in nodes] == [True, True]
        spaces = [
            subprocess.run(
                ["ip", "netns", "identify", str(n["pid"])], capture_output=True, text=True
            ).stdout.strip()
            for n in nodes
        ]
        assert all(spaces) and len(set(spaces)) == 2, spaces
        # Agents listen on their namespaces' addresses; the API stays on loopback.
        assert all(n["address"][0].startswith("198.1") for n in nodes)
        assert s.url.startswith("http://127.0.0.1:")
        body = {"model": "tiny", "prompt": "netns says", "max_tokens": 8, "temperature": 0}
        out = httpx.post(s.url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=120)
        assert out.json()["choices"][0]["text"] == reference("netns says", 8)
    finally:
        s.stop()  # fails the test if an agent outlived surge serve
    assert netns.resources(spaces[0].split("-")[0]) == [], "surge serve left its netns cluster"


@needs_netns
@pytest.mark.timeout(240)
def test_serve_emulated_on_a_netns_cluster(tmp_path, surge_home, tiny_store_dir, reference) -> None:  # noqa: F811
    """`surge serve --cluster netns --emulate ...` serves the real model's tokens with its
    steps paced (counted in /metrics) and leaves nothing behind when stopped."""
    import httpx

    config = {"nodes": 2, "deployments": [{"name": "tiny", "model": str(tiny_store_dir)}]}
    args = ("--cluster", "netns", "--emulate", "lambdascale-testbed1:llama2-7b")
    s = start_serve(tmp_path, surge_home, config, *args, "--time-dilation", "2")
    try:
        nodes = s.http.get("/v1/nodes").json()["data"]
        assert [n["up"] for n in nodes] == [True, True]
        body = {"model": "tiny", "prompt": "emulated", "max_tokens": 8, "temperature": 0}
        out = httpx.post(s.url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=120)
        assert out.json()["choices"][0]["text"] == reference("emulated", 8)
        metrics = s.http.get("/metrics").text
        steps = [
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("surge_emulation_steps_total{")
        ]
        assert sum(steps) >= 8, metrics  # one prefill and 7 decodes, at least, were paced
        assert "surge_emulation_violations_total{" in metrics
        spaces = [
            subprocess.run(
                ["ip", "netns", "identify", str(n["pid"])], capture_output=True, text=True
            ).stdout.strip()
            for n in nodes
        ]
    finally:
        s.stop()  # fails the test if an agent outlived surge serve
    assert netns.resources(spaces[0].split("-")[0]) == [], "surge serve left its netns cluster"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "mininet"], "--cluster 'mininet' is not one of loopback, netns"),
        (["--cluster", "netns", "--launcher", "ray"], "--cluster netns needs --launcher local"),
        (["--agent-host", "node-ip"], "--agent-host needs --launcher ray"),
    ],
)
def test_serve_rejects_a_bad_cluster_in_one_line(args, message) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "surge.cli", "serve", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
