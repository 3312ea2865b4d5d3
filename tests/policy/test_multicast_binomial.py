"""Binomial pipeline: exact step counts, the bound for every N and K, k-way order."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.policy.multicast.binomial import binomial_step_bound, plan_binomial
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.subgroups import kway_block_orders, split_subgroups
from tests.policy.replay import replay


@pytest.mark.parametrize("num_nodes", [2, 4, 8, 16, 32])
def test_power_of_two_one_source_takes_exactly_b_plus_log2n_minus_1(num_nodes: int) -> None:
    for num_blocks in range(1, 65):
        plan = plan_binomial(num_nodes, num_blocks)
        replay(plan)
        assert plan.complete_step == num_blocks + int(math.log2(num_nodes)) - 1


def test_every_n_reaches_the_lower_bound_b_plus_ceil_log2n_minus_1() -> None:
    for num_nodes in range(2, 70):
        for num_blocks in (1, 2, 3, 5, 8, 13, 33):
            plan = plan_binomial(num_nodes, num_blocks)
            replay(plan)
            lower_bound = num_blocks + math.ceil(math.log2(num_nodes)) - 1
            assert plan.complete_step == lower_bound == binomial_step_bound(num_nodes, num_blocks)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 80), st.integers(1, 40), st.integers(1, 9))
def test_k_sources_take_exactly_b_plus_ceil_log2_of_n_over_k_minus_1(
    num_nodes: int, num_blocks: int, num_sources: int
) -> None:
    num_sources = min(num_sources, num_nodes - 1)
    plan = plan_binomial(num_nodes, num_blocks, num_sources)
    replay(plan)
    lower_bound = num_blocks + math.ceil(math.log2(num_nodes / num_sources) - 1e-12) - 1
    assert plan.complete_step == lower_bound


def test_kway_order_matches_lambda_scale_alg1() -> None:
    # 2 sub-groups, 4 blocks: chunks {0,1} and {2,3}; sub-group 1 starts at chunk 2.
    assert kway_block_orders(4, 2) == [[0, 1, 2, 3], [2, 3, 0, 1]]
    # 3 sub-groups, 7 blocks: chunk size ceil(7/3) = 3 -> {0,1,2} {3,4,5} {6}.
    assert kway_block_orders(7, 3) == [
        [0, 1, 2, 3, 4, 5, 6],
        [3, 4, 5, 6, 0, 1, 2],
        [6, 0, 1, 2, 3, 4, 5],
    ]
    # More sub-groups than blocks: empty chunks, every order still a permutation.
    for order in kway_block_orders(2, 4):
        assert sorted(order) == [0, 1]


def test_subgroups_split_evenly_source_first() -> None:
    assert split_subgroups(8, 2) == [[0, 2, 3, 4], [1, 5, 6, 7]]
    assert split_subgroups(9, 2) == [[0, 2, 3, 4, 5], [1, 6, 7, 8]]
    sizes = [len(g) for g in split_subgroups(23, 5)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 23


def test_each_subgroup_first_receives_its_own_first_chunk() -> None:
    plan = plan_binomial(8, 4, 2)
    first_step = {(t.src, t.block) for t in plan.steps[0]}
    assert first_step == {(0, 0), (1, 2)}
    # Transfers never cross sub-groups.
    group_of = {n: i for i, g in enumerate(split_subgroups(8, 2)) for n in g}
    assert all(group_of[t.src] == group_of[t.dst] for s in plan.steps for t in s)


def test_uniform_links_keep_the_plain_placement() -> None:
    assert plan_binomial(13, 6, 2, Cluster.uniform(13, 100.0)) == plan_binomial(13, 6, 2)


def test_fastest_destinations_receive_first_with_the_same_step_count() -> None:
    gbps = [100.0, 25.0, 25.0, 50.0, 400.0, 25.0, 200.0, 25.0, 25.0, 25.0]
    plan = plan_binomial(10, 8, 1, Cluster.symmetric(gbps))
    replay(plan)
    assert plan.complete_step == plan_binomial(10, 8).complete_step
    assert [t.dst for t in plan.steps[0]] == [4]  # the 400 Gbit/s node first
    assert 6 in {t.dst for t in plan.steps[1]}  # the 200 Gbit/s node next
