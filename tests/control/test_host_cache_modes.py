"""`surge serve` keeps the host copies each strategy's system says (`SystemConfig.host_cache`,
`policy.copies.host_copies.kept_copies`), so a system without a host cache starts cold
from its tier as its paper deploys it: ParaServe (`none`, §4: the group fetches from the
remote registry) and ServerlessLLM (`lru`: its cache fills with what its instances load)
have no host copy at creation, and their first instance's blocks reach its GPU from the
registry, not from host memory; λScale (`pinned-lru`) keeps its one pinned copy, and its
first instance loads from it (warm). Before this, every deployment got a pinned host copy at
creation, and a ParaServe or ServerlessLLM cold start was partly warm."""

import asyncio

import pytest

from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.runtime.protocol import BlockArrived, StatusOp
from tests.control.strategy_run import deploy, local_cluster, wait_until
from tests.control.test_serve_openai import MODEL


@pytest.mark.parametrize(
    ("strategy", "host_copies", "first_source"),
    [("paraserve", 0, "remote"), ("serverlessllm", 0, "remote"), ("lambdascale", 1, "host")],
)
def test_first_start_reads_the_tier_its_system_keeps(
    strategy: str, host_copies: int, first_source: str, tmp_path, tiny_store_dir
) -> None:
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2)

    async def run() -> tuple[list[int], set[int], list[BlockArrived]]:
        config = ControllerConfig(state_dir=state, nodes=2)
        ctl = Controller(config, cluster.addresses, cluster.token)
        await ctl.start()
        arrivals = ctl.client.subscribe((BlockArrived,), model=MODEL)
        try:
            scaling = {"target_ongoing_requests": 100, "max_replicas": 1}
            dep = await deploy(ctl, tiny_store_dir, strategy, scaling)
            held = ctl.pool.complete(MODEL, "host")
            pinned = set(dep.pinned_nodes)
            params = SamplingParams(max_tokens=2, ignore_eos=True)
            req = await ctl.submit(dep, [5, 6, 7], params)
            await asyncio.wait_for(req.done.wait(), 60)
            got = []
            while not arrivals.empty():
                got.append(arrivals.get_nowait())
            return held, pinned, got
        finally:
            await ctl.stop()

    with cluster:
        held, pinned, events = asyncio.run(run())
    assert len(held) == host_copies and pinned == set(held), (held, pinned)
    gpu = [e for e in events if e.tier == "gpu"]
    assert gpu, events
    # The first instance's blocks: from the registry (cold) or the pinned host copy (warm).
    assert {e.source for e in gpu} == {first_source}, [(e.node, e.block, e.source) for e in gpu]


def test_serverlessllm_loads_fill_its_lru_host_cache_and_the_next_start_is_warm(
    tmp_path, tiny_store_dir
) -> None:
    """ServerlessLLM §4 (`lru`): the first start reads the registry through the node's host
    memory, which keeps the copy (`LoadOp.keep_host`, `policy.copies.host_copies.
    copy_after_load`); once the instance is released, the next start on that node loads
    from the host copy (a cache hit), as in the simulator. Before, the runtime's cache never
    filled and every start read the registry."""
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2)

    async def run() -> tuple[list[BlockArrived], list[int], dict, list[BlockArrived]]:
        config = ControllerConfig(state_dir=state, nodes=2)
        ctl = Controller(config, cluster.addresses, cluster.token)
        await ctl.start()
        arrivals = ctl.client.subscribe((BlockArrived,), model=MODEL)

        def drain() -> list[BlockArrived]:
            got = []
            while not arrivals.empty():
                got.append(arrivals.get_nowait())
            return got

        try:
            scaling = {"target_ongoing_requests": 100, "max_replicas": 1}
            short = {"keep_alive_s": 0.5, "downscale_delay_s": 0.5}
            dep = await deploy(ctl, tiny_store_dir, "serverlessllm", {**scaling, **short})
            params = SamplingParams(max_tokens=2, ignore_eos=True)
            req = await ctl.submit(dep, [5, 6, 7], params)
            await asyncio.wait_for(req.done.wait(), 60)
            ctl.finished(req)
            first = drain()
            (node,) = {e.node for e in first if e.tier == "gpu"}
            held = ctl.pool.complete(MODEL, "host")
            status = await ctl.client.call(node, StatusOp())
            await wait_until(lambda: not dep.instances, "the instance was never released", 60)
            drain()
            req = await ctl.submit(dep, [5, 6, 7], params)
            await asyncio.wait_for(req.done.wait(), 60)
            ctl.finished(req)
            return first, held, status.models[MODEL], drain()
        finally:
            await ctl.stop()

    with cluster:
        first, held, holding, second = asyncio.run(run())
    gpu = [e for e in first if e.tier == "gpu"]
    node = gpu[0].node
    assert {e.source for e in gpu} == {"remote"}, [(e.node, e.source) for e in gpu]
    # the same read left every block in the node's host tier, announced and held
    host = [e for e in first if e.tier == "host"]
    assert sorted(e.block for e in host) == sorted(e.block for e in gpu), host
    assert held == [node] and holding.host == holding.gpu == tuple(range(len(gpu))), holding
    # the next start hits the cache: its blocks come from host memory, not the registry
    again = [e for e in second if e.tier == "gpu"]
    assert again and {(e.node, e.source) for e in again} == {(node, "host")}, again
