"""Real multicasts of a tiny model's blocks between local agents, per strategy."""

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.policy.multicast.scale_out import STRATEGIES, MulticastRequest, plan_scale_out
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.multicast import MulticastExecutor
from surge.runtime.protocol import ChecksumsOp, DropModelOp, GenerateOp, StatusOp
from tests.runtime.conftest import MODEL, assert_all_stopped, connected

PROMPT = [0, 5, 9, 200, 31]
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
STRATEGY_NODES = 5


@pytest.fixture(scope="module")
def strategy_cluster(registry: Path) -> Iterator[LocalCluster]:
    """Five agents with the engine loaded, shared by every strategy's multicast (each drops
    the model everywhere after it): one start of five torch-importing agents, not one per
    strategy (~10 s of CPU each)."""
    config = LocalClusterConfig(
        num_nodes=STRATEGY_NODES, link_gbps=0.4, preload_engine=True, remote_dir=registry
    )
    with LocalCluster(config) as cluster:
        yield cluster
    assert_all_stopped(cluster)


@pytest.fixture(scope="module")
def greedy_reference(manifest) -> list[int]:
    return LLMEngine(manifest).generate([PROMPT], PARAMS)[0].token_ids


def expected_order(plan, node: int) -> list[int]:
    return [tr.block for step in plan.steps for tr in step if tr.dst == node]


# One xdist worker runs every strategy: they share the module's cluster.
@pytest.mark.xdist_group("multicast_strategies")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_delivers_identical_blocks_in_plan_order(
    strategy: str, strategy_cluster, greedy_reference, manifest
) -> None:
    num_nodes, cluster, reference = STRATEGY_NODES, strategy_cluster, greedy_reference

    async def run():
        client = await connected(cluster, manifest)
        try:
            out = plan_scale_out(
                MulticastRequest(
                    num_nodes=num_nodes, num_blocks=manifest.num_blocks, strategy=strategy
                )
            )
            result = await MulticastExecutor(
                client, MODEL, out.plan, tier="gpu", pipelines=out.pipelines, timeout_s=60
            ).run()
            sums = await client.broadcast(ChecksumsOp(model=MODEL))
            ask = GenerateOp(model=MODEL, prompt_token_ids=tuple(PROMPT), params=PARAMS)
            tokens = await asyncio.gather(*(client.call(n, ask) for n in range(1, num_nodes)))
            return out, result, sums, tokens
        finally:  # the next strategy starts from node 0's copy alone
            await client.broadcast(DropModelOp(model=MODEL))
            await client.close()

    out, result, sums, tokens = asyncio.run(run())
    assert result.complete_s is not None and not result.dead_nodes and not result.replans
    want = {b.index: b.checksum for b in manifest.blocks}
    for node in range(num_nodes):
        assert sums[node].checksums == want, f"node {node} holds different bytes"
    for node in range(1, num_nodes):
        # Each receiver pulls in its plan order, one block at a time...
        assert result.arrival_order[node] == expected_order(out.plan, node)
    for step in out.plan.steps:
        for tr in step:
            # ...and nobody forwards a block before it has arrived there.
            assert result.arrival_s[tr.dst][tr.block] >= result.arrival_s[tr.src][tr.block]
    assert result.first_pipeline_s is not None and result.first_pipeline_s <= result.complete_s
    assert [list(t.token_ids) for t in tokens] == [reference] * (num_nodes - 1)


def test_blocks_land_in_the_host_tier_and_status_reports_them(make_cluster, manifest) -> None:
    cluster = make_cluster(3)

    async def run():
        client = await connected(cluster, manifest)
        try:
            out = plan_scale_out(MulticastRequest(num_nodes=3, num_blocks=manifest.num_blocks))
            result = await MulticastExecutor(client, MODEL, out.plan, tier="host").run()
            return result, await client.broadcast(StatusOp())
        finally:
            await client.close()

    result, status = asyncio.run(run())
    assert result.complete_s is not None
    for node in range(3):
        held = status[node].models[MODEL]
        assert held.host == tuple(range(manifest.num_blocks)) and held.gpu == ()
    assert sum(s.bytes_in for s in status.values()) == 2 * manifest.total_bytes
    assert list(itertools.chain(*result.arrival_order)) != []
