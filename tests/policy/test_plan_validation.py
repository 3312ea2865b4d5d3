"""`validate_plan` rejects every way a plan can break the step model."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.policy.multicast.binomial import plan_binomial
from surge.policy.multicast.plan import (
    Plan,
    PlanInvariantError,
    Transfer,
    make_plan,
    replay_first_error,
    validate_plan,
)


def _plan(steps: list[list[tuple[int, int, int]]], nodes: int = 3, blocks: int = 2) -> Plan:
    frozen = tuple(tuple(Transfer(*t) for t in step) for step in steps)
    return Plan("test", nodes, blocks, 1, frozen)


GOOD = [[(0, 1, 0)], [(0, 1, 1), (1, 2, 0)], [(1, 2, 1)]]


def test_a_good_plan_passes() -> None:
    validate_plan(_plan(GOOD))
    plan = make_plan("test", 3, 2, 1, [[Transfer(*t) for t in s] for s in GOOD])
    assert plan.complete_step == 3


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([[(0, 1, 0), (0, 2, 1)], [(0, 1, 1), (1, 2, 0)]], "sends twice"),
        ([[(0, 1, 0)], [(0, 2, 1), (1, 2, 0)], [(0, 1, 1)]], "receives twice"),
        ([[(0, 1, 0), (1, 2, 0)], [(0, 1, 1), (0, 2, 1)]], "does not hold"),
        ([[(0, 1, 0)], [(0, 1, 0)]], "already holds"),
        ([[(0, 1, 0)]], "never receives"),
        ([[(0, 1, 0)], [], [(0, 1, 1)]], "empty"),
        ([[(0, 3, 0)]], "out of range"),
        ([[(1, 1, 0)]], "itself"),
    ],
)
def test_broken_plans_fail_loudly(steps: list[list[tuple[int, int, int]]], message: str) -> None:
    with pytest.raises(PlanInvariantError, match=message):
        validate_plan(_plan(steps))


def test_bad_sizes_fail() -> None:
    with pytest.raises(PlanInvariantError, match="sizes"):
        validate_plan(Plan("test", 2, 1, 2, ()))


@st.composite
def _random_plans(draw: st.DrawFn) -> Plan:
    """Mostly-broken plans: random transfers, sometimes a real plan with one change."""
    nodes, blocks = draw(st.integers(2, 5)), draw(st.integers(1, 3))
    sources = draw(st.integers(1, nodes - 1))
    if draw(st.booleans()):
        steps = [list(s) for s in plan_binomial(nodes, blocks, sources).steps]
        if steps and draw(st.booleans()):
            step = draw(st.integers(0, len(steps) - 1))
            index = draw(st.integers(0, len(steps[step]) - 1))
            t = steps[step][index]
            steps[step][index] = Transfer(
                t.src, draw(st.integers(-1, nodes)), draw(st.integers(0, blocks))
            )
    else:
        transfer = st.builds(
            Transfer, st.integers(0, nodes - 1), st.integers(0, nodes - 1), st.integers(0, blocks)
        )
        steps = draw(st.lists(st.lists(transfer, max_size=3), max_size=6))
    return Plan("random", nodes, blocks, sources, tuple(tuple(s) for s in steps))


def _replay_accepts(plan: Plan) -> bool:
    """The transfer-by-transfer check (the planner's original validator)."""
    try:
        replay_first_error(plan)
    except PlanInvariantError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(_random_plans())
def test_vectorised_validation_agrees_with_a_replay(plan: Plan) -> None:
    try:
        validate_plan(plan)
        accepted = True
    except PlanInvariantError:
        accepted = False
    assert accepted == _replay_accepts(plan)
