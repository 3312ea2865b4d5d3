"""A controller killed (SIGKILL) and started again on the agents that outlived it adopts the
instances it left (docs/control.md, Restart; `policy/adoption.py`, `control/adoption.py`):
they serve again under the same name with no load and no block moved, the request the old
controller had in flight is aborted on them (its client went with it), and a request after
the restart is answered by them with no scale-out. What cannot be matched is closed, each with
its reason: a deployment the store no longer holds, another version of a model. A corrupt
autoscaler state file changes nothing of that. Before adoption a restarted controller closed
every instance and loaded as many again.

`surge serve --launcher static` joins loopback agents this test owns (as a StatefulSet's);
every `surge serve` is killed or stopped by its PID, the agents by the cluster's stop."""

import asyncio
import json
import shutil
import signal
import threading
import time

import httpx
import pytest

from surge.control.store import DeploymentStore
from surge.model.manifest import MANIFEST_NAME
from surge.runtime.launch.local import LocalCluster
from tests.control.conftest import Serve, start_serve
from tests.control.strategy_run import agent_statuses, local_cluster
from tests.control.test_serve_openai import MODEL

KEPT = {"keep_alive_s": 600, "downscale_delay_s": 600, "max_replicas": 1}


def kill(s: Serve) -> None:
    """As a crash: SIGKILL, nothing written at exit; the agents keep running."""
    s.http.close()
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait(30)
    if s.proc.stdout:
        s.proc.stdout.close()


def _complete(s: Serve, model: str, prompt: str, max_tokens: int = 8) -> tuple[str, float]:
    """A greedy completion and its seconds."""
    t0 = time.monotonic()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    r = s.http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"], time.monotonic() - t0


async def _running(cluster: LocalCluster) -> dict[int, dict[str, tuple[str, ...]]]:
    """Each agent's running instances and stages and the requests each holds, asked
    directly (not through a controller)."""
    statuses = await agent_statuses(cluster)
    return {n: {r.name: r.req_ids for r in s.running} for n, s in statuses.items()}


def _status(s: Serve, name: str) -> dict:
    return s.http.get(f"/v1/deployments/{name}").json()["status"]


def _stream_until_killed(url: str, started: threading.Event) -> None:
    """A long stream whose client goes with the controller (its connection closes)."""
    body = {"model": MODEL, "prompt": "In flight", "max_tokens": 1500, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                started.set()
    except httpx.HTTPError:
        pass
    started.set()


@pytest.mark.timeout(420)
def test_a_killed_controllers_instances_are_adopted_and_the_rest_closed(
    tmp_path, surge_home, tiny_store_dir, reference
) -> None:
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2, paced=True)  # the long request outlasts the kill
    token_file = tmp_path / "token"
    names = (MODEL, "other", "gone")
    config = {
        "slots_per_node": 2,
        "tick_s": 0.05,
        "log_level": "info",
        "deployments": [
            {"name": n, "model": str(tiny_store_dir), "autoscaling": KEPT} for n in names
        ],
    }
    with cluster:
        token_file.write_text(cluster.token + "\n")
        agents = ",".join(f"{h}:{p}" for h, p in cluster.addresses.values())
        static = ("--launcher", "static", "--agents", agents, "--token-file", str(token_file))
        first = start_serve(tmp_path, surge_home, config, *static)
        try:
            for n in names:
                _complete(first, n, "Warm up")
            held = {n: _status(first, n)["nodes"] for n in names}
            assert all(len(v) == 1 for v in held.values()), held
            started = threading.Event()
            stream = threading.Thread(target=_stream_until_killed, args=(first.url, started))
            stream.start()
            assert started.wait(60), "the long request never streamed"
            time.sleep(1.2)  # the autoscaler state's loop writes (every second)
        finally:
            kill(first)
        stream.join(60)

        # While no controller runs: "gone" leaves the store; "other" becomes another version.
        DeploymentStore(state / "deployments.sqlite").remove("gone")
        other_v2 = tmp_path / "other-v2"
        shutil.copytree(tiny_store_dir, other_v2)
        manifest = json.loads((other_v2 / MANIFEST_NAME).read_text())
        manifest["name"] = "other-v2"
        (other_v2 / MANIFEST_NAME).write_text(json.dumps(manifest))
        (state / "registry" / "other").unlink()
        (state / "registry" / "other").symlink_to(other_v2, target_is_directory=True)

        log = tmp_path / "serve.log"
        t0 = time.monotonic()
        second = start_serve(tmp_path, surge_home, config, *static)
        try:
            text, took_s = _complete(second, MODEL, "After the crash")
            restart_to_answer_s = time.monotonic() - t0
            assert text == reference("After the crash", 8)
            status = _status(second, MODEL)
            # Adopted: the same node, no scale-out, no block moved for it.
            assert status["nodes"] == held[MODEL] and status["scale_outs"] == 0, status
            assert second.metric("surge_bytes_moved_total", MODEL) == 0
            assert second.metric("surge_scale_outs_total", MODEL) == 0
            logged = log.read_text()
            node = held[MODEL][0]
            assert f"adopted {MODEL}-node{node} on node {node} with no load (1 of the old" in logged
            # The other version's instance was closed; the held carry starts it again.
            assert (
                f"dropping other (every copy) on node {held['other'][0]}: it runs another" in logged
            )
            deadline = time.monotonic() + 60
            while _status(second, "other")["instances"] < 1:
                assert time.monotonic() < deadline, "other never started again"
                time.sleep(0.1)
            assert _status(second, "other")["scale_outs"] >= 1
            assert f"closing gone-node{held['gone'][0]} on node {held['gone'][0]}" in logged
            assert f"releasing gone's device copy on node {held['gone'][0]}" in logged
            assert "no deployment named 'gone' is restored" in logged
            text, _ = _complete(second, "other", "New version")
            assert text == reference("New version", 8)
            # On the agents: the old request is gone, "gone" closed, "other" running anew.
            running = asyncio.run(_running(cluster))
            assert running[node][f"{MODEL}-node{node}"] == ()
            assert not any(n.startswith("gone") for r in running.values() for n in r), running
        finally:
            kill(second)

        # A corrupt autoscaler state file: the instances are adopted all the same.
        (state / "autoscale.json").write_text('{"version": 1, "deployments": {')
        third = start_serve(tmp_path, surge_home, config, *static)
        try:
            text, _ = _complete(third, MODEL, "Third")
            assert text == reference("Third", 8)
            assert _status(third, MODEL)["scale_outs"] == 0
            assert _status(third, "other")["scale_outs"] == 0
            logged = log.read_text()
            assert "autoscale.json is not valid" in logged
            assert logged.count(f"adopted {MODEL}-node{node} on node {node}") == 2
        finally:
            third.stop()
    print(f"restart to first answer {restart_to_answer_s:.2f} s, request {took_s:.3f} s")
