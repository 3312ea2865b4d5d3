"""Find a set of nodes that together hold every block, one contiguous stage each.

In: which blocks each candidate node holds (sets, or one step's holdings as a numpy
matrix in a `CoverIndex`), B, and limits.
Out: the stages (node, first block, last block) in layer order, using as few nodes as
possible, or None. Stages are contiguous, in layer order, cover blocks 0..B-1 exactly
once, and no node runs two stages.

Search: a stage starting at block p best runs to the end of its node's contiguous run
(a later start never hurts the rest), so each node offers one option per p. The
fewest stages ignoring the one-stage-per-node rule (greedy furthest reach) bounds the
answer from below; depth-first search with furthest reach first then deepens from
there. A budget on visited states keeps it fast; when it runs out the answer is None
for now, and a later step (more blocks held) tries again.

Speed (issue 12): a `CoverIndex` sorts, per start block and only when the search first
asks, the nodes holding it by (furthest reach, node id) with numpy; nodes that join a
pipeline are dropped from it, so forming many disjoint covers in one step costs one
index, not one scan of every candidate per search state.
"""

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np


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


def run_ends(held: np.ndarray) -> np.ndarray:
    """ends[i, p]: last block of the contiguous run of row i's held blocks from p (if held)."""
    num_blocks = held.shape[1]
    unheld_at = np.where(held, num_blocks, np.arange(num_blocks))
    next_unheld = np.minimum.accumulate(unheld_at[:, ::-1], axis=1)[:, ::-1]
    return next_unheld - 1


class CoverIndex:
    """One step's holdings of the candidate nodes, indexed by the block a stage starts at."""

    def __init__(self, nodes: Sequence[int], held: np.ndarray) -> None:
        """`nodes` in increasing id order; held[i, b]: nodes[i] holds block b."""
        holding = held.any(axis=1)  # a node holding nothing can run no stage
        self._nodes = np.asarray(nodes, dtype=np.int64)[holding]
        self._held = np.ascontiguousarray(held[holding].T)  # block-major: a start's holders
        self._ends = np.ascontiguousarray(run_ends(held[holding]).T)
        self._options: dict[int, tuple[list[int], list[int]]] = {}
        self._front: dict[int, int] = {}
        self._members = set(self._nodes.tolist())
        self.gone: set[int] = set()
        """Nodes dropped from the index (they joined a pipeline)."""

    @property
    def num_holding(self) -> int:
        """Nodes still in the index that hold at least one block."""
        return len(self._nodes) - len(self.gone)

    def drop(self, nodes: Iterable[int]) -> None:
        """Take `nodes` out of every later search."""
        self.gone.update(n for n in nodes if n in self._members)

    def options(self, position: int) -> tuple[list[int], list[int], int]:
        """(ends, nodes, first index) of stages starting at `position`: furthest reach
        first, then lowest node id; entries before the first index are all dropped."""
        cached = self._options.get(position)
        if cached is None:
            rows = np.flatnonzero(self._held[position])
            ends = self._ends[position, rows]
            order = np.argsort(-ends, kind="stable")  # rows are in node order already
            cached = (ends[order].tolist(), self._nodes[rows[order]].tolist())
            self._options[position] = cached
            self._front[position] = 0
        ends, nodes = cached
        front = self._front[position]
        while front < len(nodes) and nodes[front] in self.gone:
            front += 1
        self._front[position] = front
        return ends, nodes, front


def index_from_sets(
    holdings: Mapping[int, Set[int]], candidates: Iterable[int], num_blocks: int
) -> CoverIndex:
    """A `CoverIndex` from per-node block sets (blocks outside 0..B-1 are ignored)."""
    nodes = sorted(set(candidates))
    held = np.zeros((len(nodes), num_blocks), dtype=bool)
    for row, node in enumerate(nodes):
        blocks = [b for b in holdings[node] if 0 <= b < num_blocks]
        held[row, blocks] = True
    return CoverIndex(nodes, held)


def _min_stages_ignoring_reuse(index: CoverIndex, num_blocks: int) -> int | None:
    """Fewest stages if a node could run several; None if the union misses a block."""
    position, count = 0, 0
    while position < num_blocks:
        ends, nodes, front = index.options(position)
        if front == len(nodes):
            return None
        position = ends[front] + 1
        count += 1
    return count


def search_cover(
    index: CoverIndex,
    num_blocks: int,
    max_stages: int | None = None,
    max_search_states: int = 5000,
) -> tuple[Stage, ...] | None:
    """Fewest-stage cover of blocks 0..B-1 by distinct nodes of `index`, or None.

    Ties prefer longer first stages, then lower node ids; deterministic.
    """
    lower = _min_stages_ignoring_reuse(index, num_blocks)
    if lower is None:
        return None
    # Each stage needs its own node that holds a block, so deeper searches cannot succeed.
    upper = index.num_holding if max_stages is None else min(max_stages, index.num_holding)
    gone = index.gone
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
        ends, nodes, front = index.options(position)
        for i in range(front, len(nodes)):
            node = nodes[i]
            if node in gone or node in used:
                continue
            end = ends[i]
            if stages_left == 1 and end + 1 != num_blocks:
                break  # the last stage must reach the end; later options reach less far
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
    index = index_from_sets(holdings, candidates, num_blocks)
    return search_cover(index, num_blocks, max_stages, max_search_states)
