"""What a simulated engine's next step takes in, and when it may take it.

In: the engine's waiting requests and limits (`admissible`), and where its decode phase
stands: its decode clock V and the V the phase began at (`decode_step_left`). Out: how many
of the waiting requests the next prefill step admits, and how much of the decode step under
way is left before new work may start. The runtime's engine loop admits work only between
steps (`runtime/engine_loop.py`), so a request reaching an engine mid-way through a decode
step waits for the step's end; a pipeline's micro-batches have a head engine each
(`sim/serving_engine.py`, as `runtime/pipeline_endpoint.py`), so an idle one starts at once.
`sim/batching.py` calls both. Pure. Owned by sim/.
"""

from collections.abc import Sequence

from surge.policy.kv_admission import admits
from surge.sim.decode_batch import EPS_TOKENS, KV_EPS_TOKENS
from surge.sim.request import SimRequest


def admissible(
    waiting: Sequence[SimRequest],
    running: int,
    kv_tokens: float,
    max_batch: int,
    kv_capacity_tokens: int,
    max_prefill_tokens: int,
) -> int:
    """How many requests at the head of `waiting` the next step admits (at least one if
    the engine is empty): up to `max_batch` running, the KV cache (`kv_tokens` held now;
    a request by the tokens it has, prompt and any output it recomputes, as vLLM admits:
    `policy.kv_admission.admits`) and `max_prefill_tokens` of prompt (a P/D hand-off,
    whose KV came with it, fits)."""
    count, tokens = 0, 0
    for req in waiting:
        busy = running + count
        free = kv_capacity_tokens - kv_tokens + KV_EPS_TOKENS
        fits_kv = admits(req.prefill_tokens, free) or busy == 0
        fits_prefill = req.kv_ready or tokens + req.prefill_tokens <= max_prefill_tokens
        if busy >= max_batch or not fits_kv or not (fits_prefill or count == 0):
            break
        count, kv_tokens = count + 1, kv_tokens + req.prefill_tokens
        tokens += 0 if req.kv_ready else req.prefill_tokens
    return count


def decode_step_left(v: float, decode_v0: float) -> float:
    """The share of one decode step (0 to 1) before work may start: 0 at a step boundary
    (V at `decode_v0` + k, the phase's steps end one token apart)."""
    done = (v - decode_v0) % 1.0
    return 1.0 - done if EPS_TOKENS < done < 1.0 - EPS_TOKENS else 0.0
