"""FlexPipe's merge: which head engine serves each sequence a merge leaves without one.

In: after a refactoring lowers a pipeline's micro-batch count (a merge, §6), the decoding
sequences each surviving ("active") head engine holds, each retired engine's decoding
sequences (in the order it admitted them) and one engine's batch limit. Out: `adoptions`,
for each sequence that moves, (retired engine, its sequence's index there, active
engine): it joins the active engine holding the fewest (`join_micro_batch`, the rule a
new request follows) while one has room; the rest stay on their retired engine, which
finishes them.

Why: Alg. 1 line 15 "activate[s the] new pipeline configuration", and §6.3 keeps the
inference going through the refactoring, so the in-flight sequences are the new
configuration's: one micro-batch per stage (§7 Eq. 12), one decode step serving them all.
Left on their own engines (`FlexPipeSettings.batch_merged_sequences` False, the
counterfactual), the retired engines step in turn on the merged stages, each step through
every layer: after a busy 4 -> 1 merge a sequence gets a token every fourth step
(docs/flexpipe.md "Measured"). The simulator (`sim/serving_engine.py`) and the runtime's
pipeline head (`runtime/pipeline_endpoint.py`) both carry it out at the switch, between two
steps of each engine, the K/V staying where it is (`tests/parity/test_flexpipe_merge_parity.py`).
Pure and deterministic.
"""

from collections.abc import Sequence

from surge.errors import SurgeError
from surge.policy.pipeline_batches import join_micro_batch


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
