"""KV admission parity: the engine's scheduler (`engine/scheduler.py`) and the simulator's
batcher (`sim/batching.py`, its cache in `sim/decode_batch.py`) admit a request by the tokens it
has (its prompt), not the output it will have, and when a decode step finds the cache full
both preempt the latest admitted requests (`policy.kv_admission.decode_preemptions`), which
are recomputed later by a prefill over prompt and output, as vLLM does. One scenario, a
cache of 40 tokens that holds four prompts but not their outputs, runs through both: the
engine stepped by hand (no model: each sampled token is a constant), the simulator at a
constant prefill and decode step time. Every request's first token and end come at the same
step in both, and preemptions happen."""

import pytest

from surge.config import EngineConfig
from surge.engine.sampling import SamplingParams
from surge.engine.scheduler import Scheduler, Sequence
from surge.sim.batching import Batcher
from surge.sim.costs import CostModel
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop
from surge.sim.request import SimRequest

CAPACITY_TOKENS = 40
PROMPTS = (8, 6, 10, 5)
OUTPUTS = (12, 20, 9, 15)
PREFILL_S, DECODE_S = 1.0, 0.01
"""One prefill step and one decode step, whatever their tokens (so times count steps)."""


def _engine() -> tuple[dict[int, float], dict[int, float], int]:
    """Per request its first token and end (seconds at the step times above), and the
    preemptions, with the engine's scheduler stepped by hand."""
    config = EngineConfig(
        page_size_tokens=1,
        max_kv_tokens=CAPACITY_TOKENS,
        max_num_seqs=8,
        prefill_chunk_tokens=0,
        enable_prefix_caching=False,
        compile_decode=False,
    )
    sched = Scheduler(config)
    for i, (p, o) in enumerate(zip(PROMPTS, OUTPUTS, strict=True)):
        sched.add(Sequence(i, list(range(1, p + 1)), SamplingParams(max_tokens=o)))
    now_s, first, done, preemptions = 0.0, {}, {}, 0
    while sched.has_unfinished:
        step = sched.schedule()
        assert step is not None
        preemptions += len(step.preempted)
        now_s += PREFILL_S if step.is_prefill else DECODE_S
        for seq in step.seqs:
            seq.num_cached = seq.num_tokens
            seq.output_token_ids.append(7)
            first.setdefault(seq.seq_id, now_s)
            if len(seq.output_token_ids) == seq.params.max_tokens:
                sched.finish(seq, "length")
                done[seq.seq_id] = now_s
        assert sched.held_pages <= config.num_pages
    return first, done, preemptions


def _sim() -> tuple[dict[int, float], dict[int, float]]:
    """Per request its first token and end in the simulator's batcher."""
    loop = EventLoop()
    # one layer: a prefill step costs PREFILL_S whatever its tokens, a decode step DECODE_S
    cost = CostModel(PREFILL_S, 0.0, DECODE_S, 0.0, num_layers=1)
    eng = Batcher(
        0,
        loop,
        EngineSpec(cost, "both", 8, CAPACITY_TOKENS, 10**6),
        lambda e, r: None,
        lambda e, r: None,
    )
    reqs = [
        SimRequest(i, 0, 0.0, p, o) for i, (p, o) in enumerate(zip(PROMPTS, OUTPUTS, strict=True))
    ]
    held = []
    eng.submit_many(reqs)
    for k in range(1, 2000):  # the cache's tokens, sampled through the run
        loop.schedule(k * DECODE_S / 2, 0, 0, lambda: held.append(eng.kv_tokens))
    loop.run(until_s=100.0)
    assert max(held) <= CAPACITY_TOKENS + 1e-6
    return {r.id: r.first_token_s for r in reqs}, {r.id: r.done_s for r in reqs}


def test_engine_and_simulator_admit_and_preempt_alike() -> None:
    e_first, e_done, preemptions = _engine()
    s_first, s_done = _sim()
    assert preemptions > 0  # the scenario preempts: 4 prompts fit, their outputs do not
    assert len(e_done) == len(PROMPTS)
    # by prompt: all four start in the first prefill step (the whole output, 109 tokens of
    # 40, would have admitted two)
    assert all(e_first[i] == pytest.approx(PREFILL_S) for i in range(len(PROMPTS)))
    for i in range(len(PROMPTS)):
        assert s_first[i] == pytest.approx(e_first[i]), i
        assert s_done[i] == pytest.approx(e_done[i]), i
