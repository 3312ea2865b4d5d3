"""FlexPipe §7 on an agent: a stage's GPU blocks evicted with `keep_host` stay in the host
tier (a GPU -> host copy, announced as host arrivals), so the next stage there loads them
from host memory (warm) and gets the same bytes; a plain eviction keeps nothing."""

import asyncio

import pytest

from surge.errors import SurgeError
from surge.runtime import protocol as p
from tests.runtime.conftest import MODEL, connected


def test_evicted_stage_blocks_stay_in_the_host_tier_and_load_warm(make_cluster, manifest) -> None:
    cluster = make_cluster(1)
    stage = (0, 1)

    async def run():
        client = await connected(cluster, manifest, loads={0: list(stage)}, tier="gpu")
        arrivals = client.subscribe((p.BlockArrived,), model=MODEL)
        try:
            before = (await client.call(0, p.ChecksumsOp(model=MODEL))).checksums
            await client.call(0, p.EvictOp(model=MODEL, blocks=stage, tier="gpu", keep_host=True))
            kept = (await client.call(0, p.StatusOp())).models[MODEL]
            await client.call(0, p.LoadOp(model=MODEL, blocks=stage, tier="gpu", source="host"))
            warm = (await client.call(0, p.ChecksumsOp(model=MODEL))).checksums
            # the same eviction without keep_host after the host copy is gone: nothing kept
            await client.call(0, p.EvictOp(model=MODEL, blocks=stage, tier="host"))
            await client.call(0, p.EvictOp(model=MODEL, blocks=stage, tier="gpu"))
            plain = (await client.call(0, p.StatusOp())).models[MODEL]
            events = []
            while not arrivals.empty():
                events.append(arrivals.get_nowait())
            return before, kept, warm, plain, events
        finally:
            await client.close()

    before, kept, warm, plain, events = asyncio.run(run())
    assert kept.host == stage and kept.gpu == (), kept  # freed on the GPU, kept in host
    assert [(e.block, e.tier) for e in events if e.tier == "host"] == [(0, "host"), (1, "host")]
    gpu_again = [e for e in events if e.tier == "gpu"]
    assert [e.block for e in gpu_again] == list(stage)
    assert all(e.source == "host" for e in gpu_again), gpu_again  # warm: from host memory
    assert warm == before  # the same bytes came back
    assert plain.host == () and plain.gpu == (), plain


def test_keep_host_is_only_for_the_gpu_tier() -> None:
    with pytest.raises(SurgeError, match="keep_host is for gpu"):
        p.EvictOp(model=MODEL, blocks=(0,), tier="host", keep_host=True)
