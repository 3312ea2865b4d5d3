"""FlexPipe inflight pipeline refactoring as a plan (§6, Fig. 6, Eq. 10).

In: the current stages and the chosen ones (each a slot and a contiguous block range,
together covering blocks 0..B−1 in order), and the running requests with their number
of valid KV tokens. Out: a `RefactorPlan` the runtime applies with its consolidation
mechanism while the old pipeline keeps serving:

- `block_moves`: which block goes from which slot to which, for every block a new stage
  lacks (from the slot that serves it now; refinement, Fig. 6a, and consolidation,
  Fig. 6c, are the same operation on block ranges);
- `kv_copies`: for every running request and every block whose serving slot changes, the
  request's KV entries of that block's layers go to the new slot. Eq. 10,
  C(t) = ∪_i KV_i(t) ⊗ M_valid: only the valid tokens are copied, so a copy carries the
  request's valid-token count and a request with none needs nothing;
- `evictions`: blocks a slot no longer serves, freed once the new pipeline is active.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from surge.errors import SurgeError


@dataclass(frozen=True)
class StageSpan:
    """One stage: a slot serving blocks [first_block, end_block)."""

    slot_id: int
    """The slot (GPU) that runs the stage."""
    first_block: int
    """First block of the stage."""
    end_block: int
    """One past the last block."""


@dataclass(frozen=True)
class RunningRequest:
    """A request in flight whose KV cache must survive the refactoring."""

    request_id: str
    """Identifier."""
    num_valid_tokens: int
    """Tokens whose KV entries are valid (M_valid's ones, >= 0)."""


@dataclass(frozen=True)
class BlockMove:
    """Copy one block's parameters between slots."""

    block: int
    """The block."""
    src_slot: int
    """The slot serving it now."""
    dst_slot: int
    """The slot that serves it after the refactoring."""


@dataclass(frozen=True)
class KvCopy:
    """Copy one request's valid KV entries of one block's layers between slots."""

    request_id: str
    """The request."""
    block: int
    """The block whose layers' KV entries move."""
    src_slot: int
    """Slot holding them now."""
    dst_slot: int
    """Slot serving the block afterwards."""
    num_tokens: int
    """Valid tokens copied (Eq. 10's mask)."""


@dataclass(frozen=True)
class RefactorPlan:
    """How to get from the current stages to the chosen ones without stopping."""

    block_moves: tuple[BlockMove, ...]
    """Parameter copies, by block then destination."""
    kv_copies: tuple[KvCopy, ...]
    """KV-cache copies, by request then block."""
    evictions: tuple[tuple[int, int], ...]
    """(slot, block) pairs to free once the new stages serve."""


def block_owners(stages: Sequence[StageSpan], num_blocks: int) -> dict[int, int]:
    """Block -> serving slot, after checking the stages cover 0..B−1 in order, each on its
    own slot (§6.2: no two stages of one model on one slot)."""
    if not stages:
        raise SurgeError("a pipeline needs at least one stage")
    if len({s.slot_id for s in stages}) != len(stages):
        raise SurgeError("two stages of one model on one slot; give each stage its own slot")
    owners: dict[int, int] = {}
    expected = 0
    for s in stages:
        if s.first_block != expected or s.end_block <= s.first_block:
            raise SurgeError(
                f"stages must cover blocks 0..{num_blocks - 1} in order without gaps "
                f"(stage on slot {s.slot_id} starts at {s.first_block}, expected {expected})"
            )
        owners.update({b: s.slot_id for b in range(s.first_block, s.end_block)})
        expected = s.end_block
    if expected != num_blocks:
        raise SurgeError(f"stages end at block {expected}, the model has {num_blocks}")
    return owners


def plan_refactor(
    current: Sequence[StageSpan],
    target: Sequence[StageSpan],
    requests: Sequence[RunningRequest],
) -> RefactorPlan:
    """The moves and copies that turn `current` into `target` (see module docstring)."""
    if any(r.num_valid_tokens < 0 for r in requests):
        raise SurgeError("num_valid_tokens must be >= 0")
    num_blocks = max(s.end_block for s in current) if current else 0
    old = block_owners(current, num_blocks)
    new = block_owners(target, num_blocks)
    changed = [b for b in range(num_blocks) if old[b] != new[b]]
    moves = tuple(BlockMove(b, old[b], new[b]) for b in changed)
    copies = tuple(
        KvCopy(r.request_id, b, old[b], new[b], r.num_valid_tokens)
        for r in sorted(requests, key=lambda r: r.request_id)
        if r.num_valid_tokens > 0
        for b in changed
    )
    evictions = tuple((old[b], b) for b in changed)
    return RefactorPlan(block_moves=moves, kv_copies=copies, evictions=evictions)


@dataclass(frozen=True)
class KvTopUp:
    """One request's K/V still to move at the switch: tokens [first_token, num_tokens)."""

    request_id: str
    first_token: int
    num_tokens: int


def kv_top_ups(
    copied: Sequence[tuple[str, int]], running: Sequence[tuple[str, int]]
) -> tuple[KvTopUp, ...]:
    """FlexPipe §6.3: the K/V of the running requests moves while the old pipeline keeps
    serving (`copied`: (request, valid tokens) as copied then); at the switch only what
    came since goes (`running`: (request, valid tokens) now), so the pause carries a few
    tokens per request instead of every one. A request not copied before (it started
    meanwhile), or with fewer valid tokens now than copied (its cache was rebuilt), goes
    whole; one with as many as copied needs nothing; finished ones are dropped."""
    before = dict(copied)
    out = []
    for rid, n in running:
        first = before.get(rid, 0)
        if first > n:
            first = 0
        if n > first:
            out.append(KvTopUp(rid, first, n))
    return tuple(out)
