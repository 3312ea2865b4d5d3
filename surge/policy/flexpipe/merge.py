"""FlexPipe's merge: which head engine serves each sequence a merge leaves without one.

In: after a refactoring lowers a pipeline's micro-batch count (a merge, §6), each retired
engine's sequence's phase (`phase_of`: never started, partway through its prefill, or
decoding), the decoding sequences each surviving ("active") head engine holds, each retired
engine's decoding sequences (in the order it admitted them) and one engine's batch limit.
Out: `merge_move`, what becomes of a sequence of each phase, and `adoptions`, for each
decoding sequence that moves, (retired engine, its sequence's index there, active engine):
it joins the active engine holding the fewest (`join_micro_batch`, the rule a new request
follows) while one has room; the rest stay on their retired engine, which finishes them.

Why: Alg. 1 line 15 "activate[s the] new pipeline configuration", and §6.3 keeps the
inference going through the refactoring, so the in-flight sequences are the new
configuration's: one micro-batch per stage (§7 Eq. 12), one decode step serving them all.
Left on their own engines (`FlexPipeSettings.batch_merged_sequences` False, the
counterfactual), the retired engines step in turn on the merged stages, each step through
every layer: after a busy 4 -> 1 merge a sequence gets a token every fourth step
(docs/flexpipe.md "Measured"). The simulator (`sim/serving_engine.py`) and the runtime's
pipeline head (`runtime/pipeline_endpoint.py`) both carry it out at the switch, between two
steps of each engine, the K/V staying where it is (`tests/parity/test_flexpipe_merge_parity.py`).

A sequence partway through its prefill (the runtime's chunked prefill between two pieces, a
preempted one waiting to recompute) finishes it on its retired engine and is offered as a
decoding one at that engine's first step boundary after (`MergeMove.AFTER_PREFILL`): §6.3
keeps "the inference ... on the original pipeline configuration" while the K/V that makes
the cache consistent is not there yet (Eq. 10 tracks it "at the token level"), and once its
prefill is done its K/V covers every token but its last, the state in which both bodies'
engines take a sequence over. The paper says nothing of chunked prefill; moving the
sequence with its valid pieces at once is not built (the simulator prefills in one step).
Before, the runtime kept such a sequence on its old engine to its end and the simulator
moved it after its prefill: each body decided for itself. Pure and deterministic.
"""

from collections.abc import Sequence
from enum import Enum

from surge.errors import SurgeError
from surge.policy.pipeline_batches import join_micro_batch


class SeqPhase(Enum):
    """Where a sequence of a retired engine stands at a step boundary."""

    QUEUED = "queued"
    """Never started: no token generated, no K/V anywhere."""
    PREFILLING = "prefilling"
    """Started, its prefill not done: partway through a chunked prefill, or preempted (or
    resumed) and waiting to recompute its K/V."""
    DECODING = "decoding"
    """Every token but its last has its K/V: the next step decodes it."""


class MergeMove(Enum):
    """What a merge does with a retired engine's sequence (`merge_move`)."""

    JOIN_NOW = "join_now"
    """Offered to the active engines now (`adoptions`), its K/V in place."""
    QUEUE_NOW = "queue_now"
    """Queues at the active engine holding the fewest (`join_micro_batch`), as new work."""
    AFTER_PREFILL = "after_prefill"
    """Its engine finishes its prefill; at that engine's first step boundary after, it is
    offered as a decoding one (`JOIN_NOW`)."""


def phase_of(started: bool, uncached_tokens: int) -> SeqPhase:
    """A sequence's phase from whether it started (generated a token or cached any K/V)
    and its tokens whose K/V is not there (1: only the last, decoding)."""
    if uncached_tokens < 1:
        raise SurgeError("a sequence's last token never has its K/V before its step")
    if not started:
        return SeqPhase.QUEUED
    return SeqPhase.DECODING if uncached_tokens == 1 else SeqPhase.PREFILLING


def merge_move(phase: SeqPhase) -> MergeMove:
    """What the merge does with a retired engine's sequence in `phase` (module docstring:
    FlexPipe Alg. 1 line 15, §6.3)."""
    return {
        SeqPhase.QUEUED: MergeMove.QUEUE_NOW,
        SeqPhase.PREFILLING: MergeMove.AFTER_PREFILL,
        SeqPhase.DECODING: MergeMove.JOIN_NOW,
    }[phase]


def adoptions(
    active: Sequence[int], retired: Sequence[int], batch_limit: int
) -> tuple[tuple[int, int, int], ...]:
    """(retired engine, sequence index there, active engine) for each sequence that moves.
    `active`: decoding sequences each active engine holds; `retired`: those each retired
    engine holds (index i: its i-th admitted); `batch_limit`: the most an engine decodes
    at once. Retired engines in order, each one's sequences oldest first, each to the
    active engine holding the fewest that is under the limit; none left: the rest stay."""
    if not active or batch_limit < 1 or min((*active, *retired), default=0) < 0:
        raise SurgeError("one or more active engines, a batch limit >= 1, counts >= 0")
    held = list(active)
    out = []
    for src, count in enumerate(retired):
        for i in range(count):
            open_ = [j for j, n in enumerate(held) if n < batch_limit]
            if not open_:
                return tuple(out)
            dst = open_[join_micro_batch([held[j] for j in open_])]
            held[dst] += 1
            out.append((src, i, dst))
    return tuple(out)
