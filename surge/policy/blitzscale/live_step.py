"""BlitzScale live scaling (§4 Fig. 7 (d), §5.2 Eq. 1): what the partner's next step holds.

A live batch's last S layers run on its partner, the overloaded instance the new one
helps. The paper makes each batch's S layers an execution of their own on the partner, the
batches back to back in the order they reach it: §5.2 Eq. 1, "Each request's latency is
the time the source instance finishes its part of the computation, which includes its own
execution time and the sum of its previous requests' execution time (queuing time). We
only need to consider previous requests because they are executed in a FIFO order"; C2,
"The start execution time of request i on the source is" the sum of S_j over j < i; §4 Fig. 7 (d),
"Once inst.1 completes the first layer's execution, it forwards the activation back to
inst.0 to process the remaining layers". The partner's own pending requests run in the
gaps (§5.2, Fig. 12 (b): "the delay won't waste GPU because we can schedule pending
requests (e.g., 6)"), and step (1) of the protocol sends the partner's queue and its new
requests to the new instance, so while live scaling runs the partner's work is the live
batches first.

`next_step` says which of the work waiting on a partner its next step takes: the live
batch that reached it first, alone; only when no live batch waits, its own requests (its
engine's admission limits apply to those). Both bodies carry it out: the simulator's engine
at each step boundary (`sim/batching.py` `Batcher._admit`); the emulated runtime's agent,
whose one GPU (`emulation/pacing.StepPacer.step`) runs a live batch's stage step
(`runtime/node/serving.py`) before its local instance's next step while the batch waits
there. Until 2026-11-29 the simulator ran a live batch's layers inside the partner's next
prefill step, beside its own requests and other live batches (FIFO, the token budget),
and the runtime's GPU went to whichever step took it first: on the emulated §6.1 7B run the
partner prefilled request 15 (routed at 1.604 s) before batch 12-14's last layers, waiting
since 1.12 (docs/emulation.md). `tests/parity/test_live_step_parity.py`.
Pure and deterministic.
"""

from collections.abc import Hashable, Sequence

OWN = None
"""The key of a request of the partner's own (every layer; not a live batch's)."""


def next_step(work: Sequence[Hashable | None]) -> tuple[int, ...]:
    """Indices of `work` the partner's next step takes. `work` is what waits on it in the
    order it arrived, each entry the key of the live batch it belongs to (any hashable,
    one per batch) or `OWN`. The first-arrived live batch's entries when one waits (a step
    of their own, Eq. 1's FIFO); else every `OWN` entry, in order (the engine then admits
    what fits). Empty when nothing waits."""
    first = next((k for k in work if k is not OWN), OWN)
    return tuple(i for i, k in enumerate(work) if k == first)
