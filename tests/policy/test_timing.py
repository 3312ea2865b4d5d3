"""Timing model: steps to seconds, optimum on uniform links, BlitzScale's Fig. 10 order."""

import math

import pytest

from surge.policy.multicast.binomial import plan_binomial
from surge.policy.multicast.chain import build_chains, plan_chain
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.plan import make_plan
from surge.policy.multicast.scale_out import STRATEGIES, MulticastRequest, plan_scale_out
from surge.policy.multicast.send_queues import forest_queues, schedule_queues
from surge.policy.multicast.timing import TimingModel, simulate

BLOCK_BYTES = 50_000_000
GBPS = 100.0


def _block_time_s(overhead_s: float) -> float:
    return overhead_s + BLOCK_BYTES * 8 / (GBPS * 1e9)


@pytest.mark.parametrize("num_nodes", [2, 4, 8, 16, 32])
@pytest.mark.parametrize("num_blocks", [1, 3, 16, 40])
@pytest.mark.parametrize("overhead_s", [0.0, 2e-4])
def test_binomial_on_uniform_links_takes_the_optimum(
    num_nodes: int, num_blocks: int, overhead_s: float
) -> None:
    model = TimingModel.uniform_blocks(
        Cluster.uniform(num_nodes, GBPS), num_blocks, BLOCK_BYTES, overhead_s
    )
    timeline = simulate(plan_binomial(num_nodes, num_blocks), (), model)
    expected = (num_blocks + math.log2(num_nodes) - 1) * _block_time_s(overhead_s)
    assert timeline.complete_s == pytest.approx(expected)
    assert timeline.optimal_s == pytest.approx(expected)


@pytest.mark.parametrize("num_nodes", [2, 3, 5, 9, 17])
@pytest.mark.parametrize("num_blocks", [1, 4, 25])
def test_chain_with_one_source_takes_b_plus_n_minus_2_block_times(
    num_nodes: int, num_blocks: int
) -> None:
    cluster = Cluster.uniform(num_nodes, GBPS)
    model = TimingModel.uniform_blocks(cluster, num_blocks, BLOCK_BYTES, 1e-4)
    timeline = simulate(plan_chain(num_nodes, num_blocks, 1, cluster), (), model)
    expected = (num_blocks + num_nodes - 2) * _block_time_s(1e-4)
    assert timeline.complete_s == pytest.approx(expected)


def test_a_transfer_runs_at_the_slower_nic_plus_overhead() -> None:
    cluster = Cluster((100.0, 10.0), (10.0, 40.0))
    model = TimingModel(cluster, (1_000_000, 2_000_000), transfer_overhead_s=0.5)
    timeline = simulate(plan_binomial(2, 2), (), model)
    first, second = timeline.transfers
    assert first.end_s == pytest.approx(0.5 + 8e6 / 40e9)
    assert second.start_s == pytest.approx(first.end_s)
    assert second.end_s == pytest.approx(first.end_s + 0.5 + 16e6 / 40e9)


def test_fig10_faster_links_first_beats_slower_first() -> None:
    # BlitzScale Fig. 10(b): S reaches T2 faster than T1; S -> T2 -> T1 beats S -> T1 -> T2.
    num_blocks = 16
    cluster = Cluster.symmetric([100.0, 25.0, 100.0])  # node 1 = slow T1, node 2 = fast T2
    model = TimingModel.uniform_blocks(cluster, num_blocks, BLOCK_BYTES)
    assert build_chains(3, 1, cluster).children == {0: (2,), 2: (1,)}
    fast_first = simulate(plan_chain(3, num_blocks, 1, cluster), (), model)
    queues = forest_queues({0: [1], 1: [2]}, range(num_blocks))
    slow_first_plan = make_plan(
        "chain", 3, num_blocks, 1, schedule_queues(3, num_blocks, 1, queues)
    )
    slow_first = simulate(slow_first_plan, (), model)
    assert fast_first.first_pipeline_s < slow_first.first_pipeline_s / 3  # the downtime
    assert fast_first.complete_s < slow_first.complete_s

    def mean_ready_s(timeline: object) -> float:
        return sum(max(timeline.arrival_s[n]) for n in (1, 2)) / 2  # type: ignore[attr-defined]

    assert mean_ready_s(fast_first) < mean_ready_s(slow_first)


def test_fig10_order_holds_on_a_larger_heterogeneous_cluster() -> None:
    # Fast nodes first: the chain's i-th ready target is never later than with the
    # reverse (slowest first) order of the same nodes.
    gbps = [200.0, 25.0, 100.0, 50.0, 200.0, 25.0, 100.0, 50.0]
    cluster = Cluster.symmetric(gbps)
    num_blocks = 12
    model = TimingModel.uniform_blocks(cluster, num_blocks, BLOCK_BYTES)
    fast = simulate(plan_chain(8, num_blocks, 1, cluster), (), model)
    order = sorted(range(1, 8), key=lambda n: (gbps[n], n))  # slowest first
    children = {a: [b] for a, b in zip([0, *order], order, strict=False)}
    slow_plan = make_plan(
        "chain",
        8,
        num_blocks,
        1,
        schedule_queues(8, num_blocks, 1, forest_queues(children, range(num_blocks))),
    )
    slow = simulate(slow_plan, (), model)
    fast_ready = sorted(max(fast.arrival_s[n]) for n in range(1, 8))
    slow_ready = sorted(max(slow.arrival_s[n]) for n in range(1, 8))
    assert all(f <= s for f, s in zip(fast_ready, slow_ready, strict=True))
    assert fast.complete_s < slow.complete_s


def test_binomial_is_fastest_strategy_on_uniform_links() -> None:
    for num_nodes, num_blocks, num_sources in [(8, 16, 1), (13, 9, 1), (16, 32, 2), (24, 8, 3)]:
        times = {
            s: plan_scale_out(MulticastRequest(num_nodes, num_blocks, num_sources, s)).timeline
            for s in STRATEGIES
        }
        best = times["binomial"].complete_s
        assert best == pytest.approx(times["binomial"].optimal_s)
        assert all(best <= t.complete_s for t in times.values())
        assert times["naive"].complete_s >= times["binary-tree"].complete_s


def test_kway_serves_first_after_about_b_over_k_steps() -> None:
    # λScale §4.2: with k sub-groups the first complete instance needs ~ b/k steps.
    timeline = plan_scale_out(MulticastRequest(16, 16, 4)).timeline
    block_time = 100_000_000 * 8 / 100e9
    assert timeline.optimal_first_pipeline_s == pytest.approx(4 * block_time)
    assert timeline.first_pipeline_s <= timeline.complete_s / 2
