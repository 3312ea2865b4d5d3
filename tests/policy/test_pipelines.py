"""Execution pipelines: λScale's 2 -> 8 example, Alg. 2 groups, covers, mode switch."""

from surge.policy.multicast.binomial import plan_binomial
from surge.policy.multicast.chain import plan_chain
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.pipelines import (
    PipelineSettings,
    kway_pipeline_groups,
    pipelines_earliest,
    pipelines_kway,
)
from surge.policy.multicast.stage_cover import Stage, find_stage_cover
from surge.policy.multicast.subgroups import split_subgroups
from tests.policy.replay import assert_pipelines_valid


def test_lambda_scale_2_to_8_example_forms_three_cross_subgroup_pipelines() -> None:
    # FaaScale Fig. 5 / λScale Fig. 5: 2 sources, 8 nodes, 4 blocks in 2 chunks.
    plan = plan_binomial(8, 4, 2)
    groups = split_subgroups(8, 2)
    pipelines = pipelines_kway(plan, groups)
    assert_pipelines_valid(plan, pipelines)
    assert len(pipelines) == 3
    destinations = [set(g[1:]) for g in groups]
    for p in pipelines:
        assert p.step < plan.complete_step  # before the multicast completes
        assert len(p.stages) == 2
        a, b = (s.node for s in p.stages)
        assert {a in destinations[0], b in destinations[0]} == {True, False}  # one per sub-group
    paired = sorted(tuple(sorted(p.nodes)) for p in pipelines)
    assert paired == [(2, 5), (3, 6), (4, 7)]  # the t-th node of each sub-group (Alg. 2)


def test_alg2_groups_take_one_node_per_subgroup_then_leftovers() -> None:
    groups = [[0, 3, 4, 5], [1, 6, 7], [2, 8]]
    assert kway_pipeline_groups(groups) == [[3, 6, 8], [4, 7], [5]]


def test_earliest_covers_reform_after_mode_switch() -> None:
    plan = plan_binomial(16, 12)
    pipelines = pipelines_earliest(plan)
    assert_pipelines_valid(plan, pipelines)
    assert pipelines and pipelines[0].step >= 12  # one source: >= B steps to hold all blocks
    # A node switches to local mode at the end of until_step and leaves its pipeline.
    for p in pipelines:
        assert p.until_step > p.step


def test_chain_plans_form_no_multi_node_pipeline() -> None:
    # Along a chain every node holds a prefix of what the node before it holds.
    plan = plan_chain(6, 8, 1, Cluster.uniform(6, 100.0))
    assert pipelines_earliest(plan) == ()


def test_max_stages_limits_pipeline_length() -> None:
    plan = plan_binomial(32, 16, 4)
    limited = pipelines_earliest(plan, PipelineSettings(max_stages=2))
    assert_pipelines_valid(plan, limited)
    assert all(len(p.stages) <= 2 for p in limited)


def test_cover_search_backtracks_when_the_furthest_reach_blocks_later() -> None:
    holdings = {10: {0, 1, 3}, 11: {0}, 12: {1, 2}, 13: {2}}
    stages = find_stage_cover(holdings, [10, 11, 12, 13], 4)
    assert stages == (Stage(11, 0, 0), Stage(12, 1, 2), Stage(10, 3, 3))


def test_cover_search_prefers_fewest_stages_and_reports_impossible() -> None:
    holdings = {1: {0, 1, 2}, 2: {0}, 3: {1, 2, 3}, 4: {3}}
    assert find_stage_cover(holdings, [1, 2, 3, 4], 4) == (Stage(1, 0, 2), Stage(3, 3, 3))
    assert find_stage_cover({1: {0}, 2: {2}}, [1, 2], 3) is None  # nobody holds block 1
    assert find_stage_cover({1: {0, 2}, 2: {1}}, [1, 2], 3) is None  # node 1 needed twice
