"""A simulated engine holds KV as vLLM does: a request is admitted by its prompt, its output's
cache grows step by step, and when a decode step finds the cache full the latest admitted
requests are preempted and later recomputed (`policy/kv_admission.py`, `sim/decode_batch.py`).
Before, the simulator reserved each request's whole output at admission: ParaServe §8.4's
13B on one V100 ran 4 of a worker's 8 sequences where vLLM runs all 8 (benchmarks/paper
REPORT.md)."""

import pytest

from surge.policy.kv_admission import admits, decode_preemptions
from surge.sim.batching import Batcher
from surge.sim.costs import CostModel
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop
from surge.sim.request import SimRequest

COST = CostModel(1e-3, 1e-5, 1e-3, 1e-5, num_layers=8)
PROMPT, OUTPUT, BATCH = 512, 512, 8


def _run(capacity_tokens: int) -> tuple[list[SimRequest], list[float]]:
    """Eight 512/512 requests at once on one engine of `capacity_tokens`; the tokens its
    cache holds, sampled every 10 ms."""
    loop = EventLoop()
    spec = EngineSpec(COST, "both", BATCH, capacity_tokens, 10**6)
    eng = Batcher(0, loop, spec, lambda e, r: None, lambda e, r: None)
    reqs = [SimRequest(i, 0, 0.0, PROMPT, OUTPUT) for i in range(BATCH)]
    eng.submit_many(reqs)
    held: list[float] = []
    for k in range(1, 3000):
        loop.schedule(k * 0.01, 0, 0, lambda: held.append(eng.kv_tokens))
    loop.run(until_s=60.0)
    return reqs, held


def test_requests_are_admitted_by_prompt_not_by_their_whole_output() -> None:
    # room for the 8 prompts and 100 tokens of output each, not for 8 x 1024
    reqs, _ = _run(BATCH * (PROMPT + 100))
    first = {r.first_token_s for r in reqs}
    assert len(first) == 1  # one prefill step took all eight


def test_a_full_cache_preempts_the_latest_admitted_and_recomputes_them() -> None:
    capacity = BATCH * (PROMPT + 100)
    reqs, held = _run(capacity)
    assert all(r.done_s > 0 and r.generated == OUTPUT for r in reqs)
    assert max(held) <= capacity + 1e-6
    assert max(held) > capacity - BATCH  # the cache filled
    done = [r.done_s for r in reqs]
    # the earliest admitted run to their end without a break; the latest were preempted,
    # recomputed and end later, in admission order
    assert done[0] == pytest.approx(done[1])
    assert done[-1] > done[0]
    assert done == sorted(done)


def test_a_cache_that_holds_every_output_never_preempts() -> None:
    reqs, held = _run(BATCH * (PROMPT + OUTPUT))
    assert len({r.done_s for r in reqs}) == 1
    assert max(held) <= BATCH * (PROMPT + OUTPUT) + 1e-6


def test_admission_and_preemption_rules() -> None:
    assert admits(4, 4) and not admits(5, 4)
    # room for two more tokens: the latest of four gives its 10 back, the rest fit
    assert decode_preemptions([1, 1, 1, 1], [10, 10, 10, 10], 2) == 1
    # each holds one: the two latest go, one for each of the first two
    assert decode_preemptions([1, 1, 1, 1], [1, 1, 1, 1], 1) == 2
    assert decode_preemptions([1, 1, 1], [10, 10, 10], 3) == 0
    # the latest, preempted, frees enough for the others
    assert decode_preemptions([1, 1, 1], [10, 10, 10], 0) == 1
    # the one that does not fit is itself the latest left
    assert decode_preemptions([2, 5], [1, 1], 2) == 1
