"""`surge serve` keeps the host copies each strategy's system says (`SystemConfig.host_cache`,
`policy.copies.host_copies.kept_copies`), so a system without a host cache starts cold
from its tier as its paper deploys it: ParaServe (`none`, §4: the group fetches from the
remote registry) and ServerlessLLM (`lru`: its cache fills with what its instances load)
have no host copy at creation, and their first instance's blocks reach its GPU from the
registry, not from host memory; λScale (`pinned-one`) keeps its one pinned copy, and its
first instance loads from it (warm). Before this, every deployment got a pinned host copy at
creation, and a ParaServe or ServerlessLLM cold start was partly warm."""

import asyncio

import pytest

from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.runtime.protocol import BlockArrived
from tests.control.strategy_run import deploy, local_cluster
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
