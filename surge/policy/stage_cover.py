"""Find a set of nodes that together hold every block, one contiguous stage each.

In: which blocks each candidate node holds, B, and limits.
Out: the stages (node, first block, last block) in layer order, using as few nodes as
possible, or None. Stages are contiguous, in layer order, cover blocks 0..B-1 exactly
once, and no node runs two stages.

Search: a stage starting at block p best runs to the end of its node's contiguous run
(a later start never hurts the rest), so each node offers one option per p. The
fewest stages ignoring the one-stage-per-node rule (greedy furthest reach) bounds the
answer from below; depth-first search with furthest reach first then deepens from
there. A budget on visited states keeps it fast; when it runs out the answer is None
for now, and a later step (more blocks held) tries again.
"""

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One node of an execution pipeline running blocks first..last (inclusive)."""

    node: int
    """Node that runs the stage."""
    first_block: int
    """First block (layer order) of the stage."""
    last_block: int
    """Last block of the stage, >= first_block."""


class _OutOfBudget(Exception):
    pass


def _run_end(held: Set[int], start: int) -> int:
    """Last block of the contiguous run of `held` starting at `start` (start must be held)."""
    end = start
    while end + 1 in held:
        end += 1
    return end


def _min_stages_ignoring_reuse(
    holdings: Mapping[int, Set[int]], candidates: Sequence[int], num_blocks: int
) -> int | None:
    """Fewest stages if a node could run several; None if the union misses a block."""
    position, count = 0, 0
    while position < num_blocks:
        ends = [_run_end(holdings[v], position) for v in candidates if position in holdings[v]]
        if not ends:
            return None
        position = max(ends) + 1
        count += 1
    return count


def find_stage_cover(
    holdings: Mapping[int, Set[int]],
    candidates: Sequence[int],
    num_blocks: int,
    max_stages: int | None = None,
    max_search_states: int = 5000,
) -> tuple[Stage, ...] | None:
    """Fewest-stage cover of blocks 0..B-1 by distinct `candidates`, or None.

    Ties prefer longer first stages, then lower node ids; deterministic.
    """
    ordered = sorted(candidates)
    lower = _min_stages_ignoring_reuse(holdings, ordered, num_blocks)
    if lower is None:
        return None
    upper = len(ordered) if max_stages is None else min(max_stages, len(ordered))
    states = 0
    failed: set[tuple[int, frozenset[int], int]] = set()

    def search(position: int, used: frozenset[int], stages_left: int) -> list[Stage] | None:
        nonlocal states
        if position == num_blocks:
            return []
        if stages_left == 0 or (position, used, stages_left) in failed:
            return None
        states += 1
        if states > max_search_states:
            raise _OutOfBudget
        options = sorted(
            (
                (_run_end(holdings[v], position), v)
                for v in ordered
                if v not in used and position in holdings[v]
            ),
            key=lambda option: (-option[0], option[1]),
        )
        for end, node in options:
            rest = search(end + 1, used | {node}, stages_left - 1)
            if rest is not None:
                return [Stage(node, position, end), *rest]
        failed.add((position, used, stages_left))
        return None

    try:
        for depth in range(lower, upper + 1):
            found = search(0, frozenset(), depth)
            if found is not None:
                return tuple(found)
    except _OutOfBudget:
        return None
    return None
