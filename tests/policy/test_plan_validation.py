"""`validate_plan` rejects every way a plan can break the step model."""

import pytest

from surge.policy.plan import Plan, PlanInvariantError, Transfer, make_plan, validate_plan


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
