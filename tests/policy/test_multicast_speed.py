"""Planner speed (issue 12): large plans finish and validate in bounded time, limits
fail with the fix, and the fast paths decide exactly what the plain algorithms do.

The plain algorithms below are the planner's earlier, direct implementations: the
fast ones (indexed cover search, forest scheduling in numpy, skipped pipeline steps)
must return the same answers on random inputs.
"""

import gc
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.errors import SurgeError
from surge.policy.multicast.binomial import binomial_step_bound, plan_binomial
from surge.policy.multicast.pipelines import Pipeline, PipelineSettings, pipelines_earliest
from surge.policy.multicast.plan import Plan, arrival_steps, make_plan
from surge.policy.multicast.scale_out import (
    MAX_BLOCK_TRANSFERS,
    MAX_BLOCKS,
    MAX_NODES,
    MulticastRequest,
    plan_scale_out,
)
from surge.policy.multicast.send_queues import forest_queues, forest_steps, schedule_queues
from surge.policy.multicast.stage_cover import Stage, find_stage_cover
from tests.policy.replay import assert_pipelines_valid, replay


def test_a_large_request_plans_and_validates_in_bounded_time() -> None:
    started = time.process_time()
    outcome = plan_scale_out(MulticastRequest(num_nodes=2048, num_blocks=16))
    took_s = time.process_time() - started
    assert outcome.plan.complete_step == binomial_step_bound(2048, 16)
    assert_pipelines_valid(outcome.plan, outcome.pipelines)
    assert outcome.timeline.complete_s == pytest.approx(outcome.timeline.optimal_s)
    assert took_s < 10.0  # about 0.3 s of CPU; the old planner took over a minute


@pytest.mark.parametrize("strategy", ["chain", "binary-tree", "naive"])
def test_large_forest_plans_validate(strategy: str) -> None:
    outcome = plan_scale_out(MulticastRequest(num_nodes=1024, num_blocks=8, strategy=strategy))
    replay(outcome.plan)
    assert len(outcome.timeline.transfers) == 1023 * 8


@pytest.mark.parametrize(
    ("nodes", "blocks", "message"),
    [
        (MAX_NODES + 1, 1, f"limit of {MAX_NODES:,} nodes"),
        (4, MAX_BLOCKS + 1, "fewer, larger blocks"),
        (MAX_BLOCK_TRANSFERS // 64 + 2, 64, "plan at most 16,385 nodes with 64 blocks"),
    ],
)
def test_requests_past_the_limits_name_the_fix(nodes: int, blocks: int, message: str) -> None:
    with pytest.raises(SurgeError, match=message):
        MulticastRequest(num_nodes=nodes, num_blocks=blocks)


def test_the_largest_allowed_request_is_accepted() -> None:
    MulticastRequest(num_nodes=MAX_BLOCK_TRANSFERS // 64 + 1, num_blocks=64)


# --- the plain algorithms, as reference -------------------------------------------


def _plain_cover(
    holdings: dict[int, set[int]], candidates: list[int], num_blocks: int, budget: int
) -> tuple[Stage, ...] | None:
    """Iterative-deepening DFS over every candidate at every state (no index)."""

    def run_end(held: set[int], start: int) -> int:
        while start + 1 in held:
            start += 1
        return start

    ordered = sorted(candidates)
    position, lower = 0, 0
    while position < num_blocks:
        ends = [run_end(holdings[v], position) for v in ordered if position in holdings[v]]
        if not ends:
            return None
        position, lower = max(ends) + 1, lower + 1
    states = 0
    failed: set = set()

    class OutOfBudget(Exception):
        pass

    def search(position: int, used: frozenset[int], left: int) -> list[Stage] | None:
        nonlocal states
        if position == num_blocks:
            return []
        if left == 0 or (position, used, left) in failed:
            return None
        states += 1
        if states > budget:
            raise OutOfBudget
        options = sorted(
            (
                (run_end(holdings[v], position), v)
                for v in ordered
                if v not in used and position in holdings[v]
            ),
            key=lambda o: (-o[0], o[1]),
        )
        for end, node in options:
            rest = search(end + 1, used | {node}, left - 1)
            if rest is not None:
                return [Stage(node, position, end), *rest]
        failed.add((position, used, left))
        return None

    try:
        for depth in range(lower, len(ordered) + 1):
            found = search(0, frozenset(), depth)
            if found is not None:
                return tuple(found)
    except OutOfBudget:
        return None
    return None


def _plain_pipelines(plan: Plan, settings: PipelineSettings) -> tuple[Pipeline, ...]:
    """Every step: free nodes, their holdings, covers until none is found."""
    arrival = arrival_steps(plan)
    completion = [max(row) for row in arrival]
    formed: list[Pipeline] = []
    live: list[Pipeline] = []
    for step in range(1, plan.complete_step + 1):
        live = [p for p in live if p.until_step > step]
        busy = {node for p in live for node in p.nodes}
        free = [
            v
            for v in range(plan.num_sources, plan.num_nodes)
            if completion[v] > step and v not in busy
        ]
        holdings = {v: {b for b, at in enumerate(arrival[v]) if 0 <= at <= step} for v in free}
        while len(free) >= 2:
            stages = find_stage_cover(
                holdings, free, plan.num_blocks, settings.max_stages, settings.max_search_states
            )
            if stages is None:
                break
            pipeline = Pipeline(step, stages, min(completion[s.node] for s in stages))
            formed.append(pipeline)
            live.append(pipeline)
            free = [v for v in free if v not in pipeline.nodes]
    return tuple(formed)


# --- the fast paths decide the same -----------------------------------------------


@st.composite
def _holdings(draw: st.DrawFn) -> tuple[dict[int, set[int]], int]:
    num_blocks = draw(st.integers(1, 10))
    nodes = draw(st.lists(st.integers(0, 30), min_size=1, max_size=9, unique=True))
    blocks = st.sets(st.integers(0, num_blocks - 1), max_size=num_blocks)
    return {v: draw(blocks) for v in nodes}, num_blocks


@settings(max_examples=300, deadline=None)
@given(_holdings(), st.sampled_from([3, 20, 5000]))
def test_indexed_cover_search_matches_the_plain_search(
    case: tuple[dict[int, set[int]], int], budget: int
) -> None:
    holdings, num_blocks = case
    candidates = list(holdings)
    expected = _plain_cover(holdings, candidates, num_blocks, budget)
    got = find_stage_cover(holdings, candidates, num_blocks, max_search_states=budget)
    assert got == expected


@st.composite
def _forests(draw: st.DrawFn) -> tuple[int, int, int, dict[int, list[int]]]:
    num_sources = draw(st.integers(1, 3))
    num_nodes = draw(st.integers(num_sources + 1, 40))
    num_blocks = draw(st.integers(1, 8))
    rng = random.Random(draw(st.integers(0, 10**6)))
    children: dict[int, list[int]] = {}
    for node in range(num_sources, num_nodes):  # each node hangs below an earlier one
        children.setdefault(rng.randrange(node), []).append(node)
    return num_nodes, num_blocks, num_sources, children


@settings(max_examples=150, deadline=None)
@given(_forests())
def test_forest_scheduling_matches_the_step_by_step_queues(
    case: tuple[int, int, int, dict[int, list[int]]],
) -> None:
    num_nodes, num_blocks, num_sources, children = case
    queues = forest_queues(children, range(num_blocks))
    steps = schedule_queues(num_nodes, num_blocks, num_sources, queues)
    expected = make_plan("forest", num_nodes, num_blocks, num_sources, steps)
    arrays = forest_steps(num_nodes, num_blocks, num_sources, children, range(num_blocks))
    assert arrays is not None
    got = sorted(zip(*(a.tolist() for a in arrays), strict=True))
    want = sorted(
        (step, t.src, t.dst, t.block)
        for step, transfers in enumerate(expected.steps, start=1)
        for t in transfers
    )
    assert got == want


def test_a_cycle_is_not_a_forest() -> None:
    assert forest_steps(4, 2, 1, {0: [1], 2: [3], 3: [2]}, range(2)) is None


@settings(max_examples=40, deadline=None)
@given(
    st.integers(3, 40),
    st.integers(1, 12),
    st.sampled_from([None, 2, 3]),
    st.sampled_from([5, 5000]),
)
def test_pipelines_skip_only_steps_where_nothing_changed(
    num_nodes: int, num_blocks: int, max_stages: int | None, budget: int
) -> None:
    plan = plan_binomial(num_nodes, num_blocks)
    pipeline_settings = PipelineSettings(max_stages=max_stages, max_search_states=budget)
    assert pipelines_earliest(plan, pipeline_settings) == _plain_pipelines(plan, pipeline_settings)


def test_planning_leaves_the_garbage_collector_as_it_found_it() -> None:
    assert gc.isenabled()
    plan_scale_out(MulticastRequest(num_nodes=8, num_blocks=4))
    assert gc.isenabled()
    gc.disable()
    try:
        plan_scale_out(MulticastRequest(num_nodes=8, num_blocks=4))
        assert not gc.isenabled()
    finally:
        gc.enable()
