"""A controller killed (SIGKILL) while a λScale execution pipeline served (λScale §4.3: a
scale-out caught mid-multicast, each receiver running the layers whose blocks it has) and
started again on the agents that outlived it adopts the pipeline whole (docs/control.md,
Restart; `policy/pipeline_adoption.py`, `control/adoption.py`): one serving instance over its
two nodes' stages, as the controller would have built it, with no load, no block moved and no
scale-out; the K/V its old head engine left on the stages is freed; the next request is
answered through it, token-exact; when a member goes down later, the other's slot is freed
at once and the deployment starts again there. Before, the restart closed both stages with
a WARNING, released their device copies and started the deployment again warm (a
scale-out).

`surge serve --launcher static` joins loopback agents this test owns; the old controller's
pipeline is left as it would have left it (its instance closed, each node holding its stage's
blocks on the device, a prefill's K/V in the stages); every `surge serve` is killed or stopped
by its PID, the agents by the cluster's stop."""

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from surge.engine.batch import BatchMeta
from surge.model.manifest import read_manifest
from surge.policy.pipeline_adoption import stage_blocks
from surge.runtime.client import ClusterClient
from surge.runtime.launch.local import LocalCluster
from surge.runtime.protocol import EvictOp, InstanceCloseOp, LoadOp, StageOpenOp, StageStepOp
from surge.runtime.scaleout.context import instance_name, pipeline_name
from tests.control.conftest import Serve, start_serve
from tests.control.strategy_run import agent_statuses, local_cluster
from tests.control.test_adopt import kill
from tests.control.test_serve_openai import MODEL

KEPT = {"keep_alive_s": 600, "downscale_delay_s": 600, "max_replicas": 1}
PIPE = pipeline_name(MODEL, "0123abcd", 0)
OLD_SEQ = 5
"""The old head engine's sequence left in the stages (one the new engines never number)."""


def complete(s: Serve, prompt: str, max_tokens: int = 8) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    r = s.http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def status(s: Serve) -> dict:
    return s.http.get(f"/v1/deployments/{MODEL}").json()["status"]


async def leave_a_pipeline(cluster: LocalCluster, store, x: int, y: int) -> list[tuple]:
    """What a crash mid-multicast leaves: node `x`'s instance closed and a two-stage pipeline,
    layers [0, h) on `x` (its other blocks evicted), [h, L) on `y` (its stage's blocks only,
    pulled from the store), with one prefill's K/V in both stages. Its (node, first, end)."""
    m = read_manifest(store)
    layers = tuple((b.first_layer, b.end_layer) for b in m.blocks)
    h, num_layers = m.blocks[m.num_blocks // 2].first_layer, m.arch.num_layers
    assert 0 < h < num_layers
    head, tail = stage_blocks(layers, 0, h), stage_blocks(layers, h, num_layers)
    client = ClusterClient(cluster.addresses, cluster.token)
    await client.connect()
    try:
        await client.call(x, InstanceCloseOp(instance=instance_name(MODEL, x)))
        rest = tuple(b for b in range(m.num_blocks) if b not in head)
        await client.call(x, EvictOp(model=MODEL, blocks=rest, tier="gpu"))
        await client.call(y, LoadOp(model=MODEL, blocks=tuple(tail), source="remote", tier="gpu"))
        await client.call(y, StageOpenOp(pipeline=PIPE, model=MODEL, first_layer=h,
                                         end_layer=num_layers))  # fmt: skip
        await client.call(x, StageOpenOp(pipeline=PIPE, model=MODEL, first_layer=0, end_layer=h,
                                         next_node=y))  # fmt: skip
        tokens = np.arange(1, 5, dtype=np.int64).reshape(1, 4)
        step = StageStepOp(pipeline=PIPE, kind="tokens", shape=(1, 4),
                           batch=BatchMeta((OLD_SEQ,), (0,), (4,)))  # fmt: skip
        await client.call_bytes(x, step, tokens)
    finally:
        await client.close()
    return [(x, 0, h), (y, h, num_layers)]


def serve_config(store, strategy: str) -> dict:
    deployment = {"name": MODEL, "model": str(store), "strategy": strategy, "autoscaling": KEPT}
    return {"slots_per_node": 1, "tick_s": 0.05, "log_level": "info", "deployments": [deployment]}


def static_args(tmp_path, cluster: LocalCluster) -> tuple[str, ...]:
    """`surge serve --launcher static` on the cluster's agents."""
    token_file = tmp_path / "token"
    token_file.write_text(cluster.token + "\n")
    agents = ",".join(f"{h}:{p}" for h, p in cluster.addresses.values())
    return ("--launcher", "static", "--agents", agents, "--token-file", str(token_file))


@pytest.mark.timeout(420)
def test_a_killed_controllers_lambdascale_pipeline_is_adopted_whole(
    tmp_path, surge_home, tiny_store_dir, reference
) -> None:
    cluster = local_cluster(tmp_path / "state", num_nodes=2)
    config = serve_config(tiny_store_dir, "lambdascale")
    with cluster:
        static = static_args(tmp_path, cluster)
        first = start_serve(tmp_path, surge_home, config, *static)
        try:
            assert complete(first, "Warm up") == reference("Warm up", 8)
            (x,) = status(first)["nodes"]
            time.sleep(1.2)  # the autoscaler state's loop writes (every second)
        finally:
            kill(first)
        y = 1 - x
        stages = asyncio.run(leave_a_pipeline(cluster, tiny_store_dir, x, y))
        left = asyncio.run(agent_statuses(cluster))
        assert {n: [(r.name, r.seq_ids) for r in s.running] for n, s in left.items()} == {
            x: [(PIPE, (OLD_SEQ,))],
            y: [(PIPE, (OLD_SEQ,))],
        }

        log = tmp_path / "serve.log"
        second = start_serve(tmp_path, surge_home, config, *static)
        try:
            assert complete(second, "After the crash") == reference("After the crash", 8)
            st = status(second)
            # Adopted: one instance on both nodes, no scale-out, no block moved.
            assert st["nodes"] == [0, 1] and st["pipelines"] == 1, st
            assert st["scale_outs"] == 0 and st["instances"] == 2, st
            assert second.metric("surge_bytes_moved_total", MODEL) == 0
            assert second.metric("surge_scale_outs_total", MODEL) == 0
            logged = log.read_text()
            spans = [f"{f}-{e - 1}" for _, f, e in stages]
            assert (f"adopted pipeline {PIPE} on nodes [{x}, {y}] (layers {spans}) with no load "
                    "(1 of the old controller's sequences freed)") in logged  # fmt: skip
            assert "a pipeline stage" not in logged
            # On the agents: the same stages, the old sequence's K/V freed, the new one's too
            # (its head engine frees it once it finished: soon after the answer).
            deadline = time.monotonic() + 30
            while True:
                after = asyncio.run(agent_statuses(cluster))
                running = {n: [(r.name, r.seq_ids) for r in s.running] for n, s in after.items()}
                if running == {x: [(PIPE, ())], y: [(PIPE, ())]} or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert running == {x: [(PIPE, ())], y: [(PIPE, ())]}, running
            assert complete(second, "Again") == reference("Again", 8)
            # A sampled request (with logprobs) is served too, and the controller never
            # imports torch: the last stage picks the tokens (`StageStepOp.draws`).
            body = {"model": MODEL, "prompt": "Sampled", "max_tokens": 8, "temperature": 1.0,
                    "seed": 3, "ignore_eos": True, "logprobs": 1}  # fmt: skip
            r = second.http.post("/v1/completions", json=body)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8, r.text
            assert len(r.json()["choices"][0]["logprobs"]["token_logprobs"]) == 8, r.text
            maps = Path(f"/proc/{second.proc.pid}/maps").read_text()
            assert "libtorch" not in maps, "the controller imported torch"
            # A member goes down: the router retires the pipeline and the other member's slot
            # is freed at once (not after its downscale delay), so the deployment starts
            # again on it and serves.
            cluster.kill(y)
            assert complete(second, "Alone") == reference("Alone", 8)
            assert status(second)["nodes"] == [x], status(second)
        finally:
            second.stop()


@pytest.mark.timeout(420)
def test_a_killed_controllers_flexpipe_pipeline_is_adopted_with_its_stages(
    tmp_path, surge_home, tiny_store_dir, reference
) -> None:
    """FlexPipe serves only through pipelines (§4): the one the old controller opened is
    adopted as the same `FlexPipeline` (its name, its stages), with no scale-out."""
    cluster = local_cluster(tmp_path / "state", num_nodes=2)
    config = serve_config(tiny_store_dir, "flexpipe")
    with cluster:
        static = static_args(tmp_path, cluster)
        first = start_serve(tmp_path, surge_home, config, *static)
        try:
            assert complete(first, "Warm up") == reference("Warm up", 8)
            (pipe,) = status(first)["flexpipe"]["pipelines"]
            held = status(first)["nodes"]
            time.sleep(1.2)  # the autoscaler state's loop writes (every second)
        finally:
            kill(first)
        second = start_serve(tmp_path, surge_home, config, *static)
        try:
            assert complete(second, "After the crash") == reference("After the crash", 8)
            st = status(second)
            assert st["flexpipe"]["pipelines"] == [pipe], (st["flexpipe"], pipe)
            assert st["nodes"] == held and st["scale_outs"] == 0, st
            assert second.metric("surge_scale_outs_total", MODEL) == 0
            logged = (tmp_path / "serve.log").read_text()
            assert f"adopted pipeline {pipe['name']}" in logged  # its key: NAME[@version]
        finally:
            second.stop()
