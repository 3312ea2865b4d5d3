"""FlexPipe §6 inflight refactoring plan: blocks and valid KV entries follow their stage."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surge.errors import SurgeError
from surge.policy.flexpipe.refactor import (
    RunningRequest,
    StageSpan,
    block_owners,
    plan_refactor,
)

REQUESTS = (RunningRequest("r1", 17), RunningRequest("r2", 0), RunningRequest("r3", 5))


def apply(current: list[StageSpan], plan, num_blocks: int) -> dict[int, set[int]]:
    """Slot -> blocks held after applying the plan's moves and evictions."""
    held: dict[int, set[int]] = {}
    for s in current:
        held.setdefault(s.slot_id, set()).update(range(s.first_block, s.end_block))
    for move in plan.block_moves:
        assert move.block in held[move.src_slot]  # copied from a slot that has it
        held.setdefault(move.dst_slot, set()).add(move.block)
    for slot, block in plan.evictions:
        held[slot].discard(block)
    return {slot: blocks for slot, blocks in held.items() if blocks}


def test_refinement_splits_a_stage_onto_a_new_slot() -> None:
    current = [StageSpan(0, 0, 4), StageSpan(1, 4, 8)]
    target = [StageSpan(0, 0, 2), StageSpan(2, 2, 4), StageSpan(1, 4, 8)]
    plan = plan_refactor(current, target, REQUESTS)
    assert {(m.block, m.src_slot, m.dst_slot) for m in plan.block_moves} == {(2, 0, 2), (3, 0, 2)}
    # Eq. 10: only requests with valid tokens copy KV, exactly their valid tokens.
    assert {(c.request_id, c.block, c.num_tokens) for c in plan.kv_copies} == {
        ("r1", 2, 17),
        ("r1", 3, 17),
        ("r3", 2, 5),
        ("r3", 3, 5),
    }
    assert set(plan.evictions) == {(0, 2), (0, 3)}


def test_consolidation_merges_stages_onto_one_slot() -> None:
    current = [StageSpan(0, 0, 2), StageSpan(1, 2, 4), StageSpan(2, 4, 6)]
    target = [StageSpan(1, 0, 6)]
    plan = plan_refactor(current, target, REQUESTS[:1])
    assert apply(current, plan, 6) == {1: set(range(6))}
    assert {c.block for c in plan.kv_copies} == {0, 1, 4, 5}  # blocks 2-3 stay on slot 1


@st.composite
def stage_lists(draw: st.DrawFn, num_blocks: int) -> list[StageSpan]:
    cuts = sorted(draw(st.sets(st.integers(1, num_blocks - 1), max_size=num_blocks - 1)))
    edges = [0, *cuts, num_blocks]
    slots = draw(st.permutations(range(num_blocks + 2)))
    return [StageSpan(slots[i], a, b) for i, (a, b) in enumerate(itertools.pairwise(edges))]


@given(data=st.data(), num_blocks=st.integers(2, 10))
def test_after_the_plan_every_slot_holds_exactly_its_stage_and_its_kv(
    data: st.DataObject, num_blocks: int
) -> None:
    current = data.draw(stage_lists(num_blocks))
    target = data.draw(stage_lists(num_blocks))
    plan = plan_refactor(current, target, REQUESTS)
    want = {s.slot_id: set(range(s.first_block, s.end_block)) for s in target}
    assert apply(current, plan, num_blocks) == want
    old, new = block_owners(current, num_blocks), block_owners(target, num_blocks)
    kv = {(r.request_id, b): old[b] for r in REQUESTS if r.num_valid_tokens for b in old}
    for c in plan.kv_copies:
        assert kv[(c.request_id, c.block)] == c.src_slot
        kv[(c.request_id, c.block)] = c.dst_slot
    assert all(kv[(r, b)] == new[b] for r, b in kv)
    # Minimal: nothing moves for a block whose slot is unchanged.
    assert len(plan.block_moves) == sum(old[b] != new[b] for b in range(num_blocks))


def test_bad_stage_lists_are_user_errors() -> None:
    with pytest.raises(SurgeError):  # two stages of one model on one slot
        plan_refactor([StageSpan(0, 0, 4)], [StageSpan(1, 0, 2), StageSpan(1, 2, 4)], ())
    with pytest.raises(SurgeError):  # gap
        plan_refactor([StageSpan(0, 0, 4)], [StageSpan(1, 0, 2), StageSpan(2, 3, 4)], ())
    with pytest.raises(SurgeError):  # wrong length
        plan_refactor([StageSpan(0, 0, 4)], [StageSpan(1, 0, 3)], ())
    with pytest.raises(SurgeError):
        plan_refactor([StageSpan(0, 0, 4)], [StageSpan(1, 0, 4)], [RunningRequest("x", -1)])


def test_kv_top_ups_move_only_what_came_since_the_copy() -> None:
    """§6.3: the K/V copied while the old pipeline served needs only its newest tokens at
    the switch; a request that started meanwhile (or whose cache shrank) goes whole, one
    unchanged needs nothing, a finished one is dropped."""
    from surge.policy.flexpipe.refactor import KvTopUp, kv_top_ups

    copied = [("a", 10), ("b", 7), ("c", 5), ("gone", 3)]
    running = [("a", 13), ("b", 7), ("c", 2), ("new", 4)]
    assert kv_top_ups(copied, running) == (
        KvTopUp("a", 10, 13),
        KvTopUp("c", 0, 2),
        KvTopUp("new", 0, 4),
    )
