"""Deleting a deployment while its first instance loads answers at once (the BlitzScale
benchmark hung after ServerlessLLM's run: `DELETE` waited for the registry read to end, and
the cancelled load's answer then came back as the next call's). Over HTTP, with real agents
whose registry is paced to ~1.5 s per block: `DELETE /v1/deployments/NAME` returns within
2 s while the load has blocks to go, every agent then holds nothing of the model (no block in
any tier, no shared memory, no disk file, not registered) and answers its control calls in
step, and the same deployment created again serves a completion."""

import asyncio
import logging
import time
from pathlib import Path

import httpx

from surge.api.app import create_app
from surge.control.controller import Controller, ControllerConfig
from surge.model.manifest import read_manifest
from surge.runtime.protocol import BlockArrived, StatusOp
from tests.control.strategy_run import local_cluster
from tests.control.test_serve_openai import MODEL

BLOCK_S = 1.5
"""Each block's registry read at the cap (the tiny model has 4 blocks)."""
PROMPT_S = 2.0
"""Bound on the DELETE (measured ~0.1 s; the old code waited ~3 blocks)."""


def test_delete_during_a_slow_load_answers_at_once_and_leaves_nothing(
    tmp_path, tiny_store_dir: Path, caplog
) -> None:
    manifest = read_manifest(tiny_store_dir)
    gbps = max(b.size_bytes for b in manifest.blocks) * 8 / 1e9 / BLOCK_S
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2, remote_gbps=gbps)
    body = {"name": MODEL, "model": str(tiny_store_dir), "strategy": "serverlessllm"}
    caplog.set_level(logging.INFO, logger="surge.control.agent_models")

    async def run() -> None:
        ctl = Controller(ControllerConfig(state_dir=state, nodes=2), cluster.addresses,
                         cluster.token)  # fmt: skip
        await ctl.start()
        transport = httpx.ASGITransport(app=create_app(ctl))
        http = httpx.AsyncClient(transport=transport, base_url="http://api", timeout=120)
        try:
            arrivals = ctl.client.subscribe((BlockArrived,), model=MODEL)
            keep = {"min_replicas": 1, "keep_alive_s": 60}
            r = await http.post("/v1/deployments", json={**body, "autoscaling": keep})
            assert r.status_code == 201, r.text
            first = await asyncio.wait_for(arrivals.get(), 60)  # the load is under way
            while first.tier != "gpu":  # (through the host tier: ServerlessLLM's LRU cache)
                first = await asyncio.wait_for(arrivals.get(), 60)
            assert first.source == "remote", first
            # in order, a block a BLOCK_S: the DELETE comes with blocks to go
            assert first.block < manifest.num_blocks - 1, first

            t0 = time.monotonic()
            r = await http.delete(f"/v1/deployments/{MODEL}")
            took_s = time.monotonic() - t0
            deleted_t = time.time()  # the agents' clock (`BlockArrived.t`), same machine
            assert r.status_code == 200, r.text
            assert took_s < PROMPT_S, f"DELETE waited {took_s:.1f} s for the load"
            assert any("running ops aborted" in m for m in caplog.messages), caplog.messages

            # A read left running would land its block within BLOCK_S: watched, none may.
            await asyncio.sleep(BLOCK_S)
            late = [arrivals.get_nowait() for _ in range(arrivals.qsize())]
            assert not [e for e in late if e.t > deleted_t], late
            for node in ctl.nodes:  # the control connection answers in step
                status = await asyncio.wait_for(ctl.client.call(node, StatusOp()), PROMPT_S)
                assert status.node == node and MODEL not in status.models, status
            assert not list(Path("/dev/shm").glob(f"surge_{cluster.cluster_id}_*"))
            assert not list(cluster.work_dir.glob(f"node*/{MODEL}"))
            assert (await http.get("/v1/deployments")).json()["data"] == []

            r = await http.post("/v1/deployments", json=body)  # the same deployment again
            assert r.status_code == 201, r.text
            ask = {"model": MODEL, "prompt": "once upon", "max_tokens": 3, "ignore_eos": True}
            r = await http.post("/v1/completions", json=ask)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 3
        finally:
            await http.aclose()
            await ctl.stop()

    with cluster:
        asyncio.run(run())


def test_delete_during_a_creation_stops_it_at_once(tmp_path, tiny_store_dir: Path) -> None:
    """λScale keeps a pinned host copy, and its creation waits for it (a warm first start):
    a DELETE meanwhile answers at once, the creation answers 409 saying why, nothing is
    left on the agents, and the deployment can be created again."""
    manifest = read_manifest(tiny_store_dir)
    gbps = max(b.size_bytes for b in manifest.blocks) * 8 / 1e9 / BLOCK_S
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2, remote_gbps=gbps)
    body = {"name": MODEL, "model": str(tiny_store_dir), "strategy": "lambdascale"}

    async def run() -> None:
        ctl = Controller(ControllerConfig(state_dir=state, nodes=2), cluster.addresses,
                         cluster.token)  # fmt: skip
        await ctl.start()
        transport = httpx.ASGITransport(app=create_app(ctl))
        http = httpx.AsyncClient(transport=transport, base_url="http://api", timeout=120)
        try:
            arrivals = ctl.client.subscribe((BlockArrived,), model=MODEL)
            creating = asyncio.ensure_future(http.post("/v1/deployments", json=body))
            first = await asyncio.wait_for(arrivals.get(), 60)  # its host copy is under way
            assert first.tier == "host" and not creating.done(), first

            t0 = time.monotonic()
            r = await http.delete(f"/v1/deployments/{MODEL}")
            took_s = time.monotonic() - t0
            assert r.status_code == 200, r.text
            assert took_s < PROMPT_S, f"DELETE waited {took_s:.1f} s for the creation"
            created = await asyncio.wait_for(creating, PROMPT_S)
            assert created.status_code == 409, created.text
            assert "deleted while it was being created" in created.text

            for node in ctl.nodes:
                status = await asyncio.wait_for(ctl.client.call(node, StatusOp()), PROMPT_S)
                assert MODEL not in status.models, status
            assert not list(Path("/dev/shm").glob(f"surge_{cluster.cluster_id}_*"))
            assert (await http.get("/v1/deployments")).json()["data"] == []

            r = await http.post("/v1/deployments", json=body)  # created again, warm
            assert r.status_code == 201, r.text
            assert r.json()["status"]["host_copies"], r.json()
        finally:
            await http.aclose()
            await ctl.stop()

    with cluster:
        asyncio.run(run())
