"""Stores (issue 14 #2, #5): a damaged store is refused at deploy with one clear error; a
store that goes bad later fails its deployment once (503 with the reason, one log line, no
retries); after a restart, a deployment whose store went missing is listed as failed and
can be deleted and deployed again."""

import asyncio
import logging
import shutil
import time
from pathlib import Path

import httpx
import pytest

from surge.api.app import create_app
from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.errors import Conflict, InvalidInput, Unavailable
from surge.model.manifest import read_manifest
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.protocol import EvictOp

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _flip_byte(store: Path, block: int) -> None:
    path = store / read_manifest(store).blocks[block].file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_damaged_stores_are_refused_and_a_store_gone_bad_fails_once(
    tmp_path, tiny_store_dir, caplog
):
    state = tmp_path / "state"
    (state / "registry").mkdir(parents=True)
    cluster = LocalCluster(LocalClusterConfig(num_nodes=2, remote_dir=state / "registry"))
    flipped = _copy(tiny_store_dir, tmp_path / "flipped")
    _flip_byte(flipped, 1)
    missing = _copy(tiny_store_dir, tmp_path / "missing")
    (missing / read_manifest(missing).blocks[2].file).unlink()
    later = _copy(tiny_store_dir, tmp_path / "later")

    async def run() -> None:
        c = Controller(ControllerConfig(state_dir=state, nodes=2), cluster.addresses, cluster.token)
        await c.start()
        try:
            with pytest.raises(InvalidInput, match=r"block 1 .*checksum"):
                await c.create({"name": "flipped", "model": str(flipped)})
            with pytest.raises(InvalidInput, match=r"block 2 .*missing"):
                await c.create({"name": "missing", "model": str(missing)})
            assert not c.describe_all()

            dep = await c.create({"name": "later", "model": str(later)})
            _flip_byte(later, 0)
            # Drop every copy the agents hold: the pinned host copy must come from the store.
            blocks = tuple(range(dep.manifest.num_blocks))
            for node in c.nodes:
                for tier in ("host", "disk"):
                    await c.client.call(node, EvictOp(model="later", blocks=blocks, tier=tier))
                    c.pool.remove("later", node, tier, blocks)
            dep.pinned_nodes.clear()
            caplog.clear()
            deadline = time.monotonic() + 20
            while "later" in c.deployments and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.5)  # ~15 ticks: a retry would log again
            status = c.describe_named("later")["status"]
            assert status["state"] == "failed" and "checksum" in status["failure"]
            with pytest.raises(Unavailable, match=r"has failed.*checksum"):
                c.deployment("later")
            loud = [
                r for r in caplog.records if r.levelno >= logging.WARNING and "later" in r.message
            ]
            assert len(loud) == 1, [r.message for r in loud]
            with pytest.raises(Conflict, match="delete it first"):
                await c.create({"name": "later", "model": str(tiny_store_dir)})
            await c.delete("later")
            assert not c.describe_all()
            dep = await c.create({"name": "later", "model": str(tiny_store_dir)})
            req = await c.submit(dep, [1, 2, 3], PARAMS)
            await asyncio.wait_for(req.done.wait(), 60)
            assert len(req.output_token_ids) == 4
            c.finished(req)
        finally:
            await c.stop()

    with cluster:
        asyncio.run(run())


def test_a_deployment_whose_store_went_missing_comes_back_failed(tmp_path, tiny_store_dir):
    state = tmp_path / "state"
    (state / "registry").mkdir(parents=True)
    cluster = LocalCluster(LocalClusterConfig(num_nodes=1, remote_dir=state / "registry"))
    gone = _copy(tiny_store_dir, tmp_path / "gone")
    cfg = ControllerConfig(state_dir=state, nodes=1)

    async def run() -> None:
        first = Controller(cfg, cluster.addresses, cluster.token)
        await first.start()
        try:
            await first.create({"name": "gone", "model": str(gone)})
        finally:
            await first.stop()
        shutil.rmtree(gone)
        second = Controller(cfg, cluster.addresses, cluster.token)
        await second.start()
        try:
            (listed,) = second.describe_all()
            assert listed["name"] == "gone" and listed["status"]["state"] == "failed"
            assert str(gone) in listed["status"]["failure"]
            # Over HTTP too: listed as failed, and its requests get 503 with the reason.
            transport = httpx.ASGITransport(app=create_app(second))
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
                listed_http = (await http.get("/v1/deployments")).json()["data"]
                assert [d["status"]["state"] for d in listed_http] == ["failed"]
                assert (await http.get("/v1/deployments/gone")).json()["status"][
                    "state"
                ] == "failed"
                r = await http.post("/v1/completions", json={"model": "gone", "prompt": "hi"})
                assert r.status_code == 503 and "has failed" in r.json()["error"]["message"]
            with pytest.raises(Unavailable, match="has failed"):
                second.deployment("gone")
            with pytest.raises(Conflict):
                await second.create({"name": "gone", "model": str(tiny_store_dir)})
            await second.delete("gone")
            assert not second.describe_all()
            dep = await second.create({"name": "gone", "model": str(tiny_store_dir)})
            req = await second.submit(dep, [1, 2], PARAMS)
            await asyncio.wait_for(req.done.wait(), 60)
            assert len(req.output_token_ids) == 4
            second.finished(req)
        finally:
            await second.stop()
        third = Controller(cfg, cluster.addresses, cluster.token)  # and it stays fixed
        await third.start()
        try:
            assert [d["status"]["state"] for d in third.describe_all()] == ["serving"]
        finally:
            await third.stop()

    with cluster:
        asyncio.run(run())
