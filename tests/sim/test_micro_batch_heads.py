"""A simulated pipeline runs one head engine per micro-batch over shared stages, as the
runtime does (`runtime/pipeline_endpoint.py`: a head engine per micro-batch; `runtime/node/
serving.py`: each stage computes one step at a time, under its lock). So a micro-batch's
decode step that reaches a stage while another micro-batch's prefill is there waits for it,
and a request joining that micro-batch starts only when the delayed step returns.

Seen in FlexPipe §9 static-2 at CV 2 on the emulated runtime (docs/emulation.md): the
request of 0.912 s joined micro-batch 0 (decoding), the one of 0.896 s was prefilling in
micro-batch 1; the runtime's first token came at 1.049 s, the simulator's (one batcher
whose decode paused only while the prefill held the first stage) at 0.963 s. Both bodies
now give 1.049 / 1.048 s (`benchmarks.emulation.flexpipe_timeline --cv 2 --variant
static-2`)."""

import pytest

from surge.sim.costs import CostModel
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop, Priority
from surge.sim.request import SimRequest
from surge.sim.serving_engine import ServingEngine

PROMPT = 512
COST = CostModel(1e-3, 1e-5, 1e-3, 1e-5, num_layers=8)
P = COST.prefill_s(PROMPT)  # one prompt's prefill through every layer
D = COST.decode_s(1)  # one sequence's decode step through every layer


def _pipeline(stages: int, hop_s: float = 0.0) -> tuple[ServingEngine, EventLoop]:
    loop = EventLoop()
    spec = EngineSpec(COST, "both", 8 * stages, 10**6, 10**6, hop_s=hop_s)
    eng = ServingEngine(0, loop, spec, lambda e, r: None, lambda e, r: None)
    eng.set_micro_batches(stages)
    return eng, loop


def _arrive(eng: ServingEngine, loop: EventLoop, req: SimRequest) -> None:
    loop.schedule(req.arrival_s, Priority.ARRIVAL, req.id, lambda: eng.submit(req))


def test_a_decode_step_waits_behind_another_micro_batch_prefill_at_every_stage() -> None:
    eng, loop = _pipeline(2)
    a = SimRequest(0, 0, 0.0, PROMPT, 1000)  # micro-batch 0, decoding from P on
    # b reaches micro-batch 1 while a's 11th step is in stage 0: b's prefill takes stage 0
    # when that step leaves it, then stage 1 (P/2 each)
    b = SimRequest(1, 0, P + 10.25 * D, PROMPT, 1000)
    # c joins micro-batch 0 (a tie: the first) during a's 12th step, which waits behind b's
    # prefill at stage 0 and at stage 1: c starts when that step returns, at 2P + 11D
    c = SimRequest(2, 0, P + 11.25 * D, PROMPT, 10)
    for req in (a, b, c):
        _arrive(eng, loop, req)
    loop.run(until_s=1.0)
    assert [eng.micro_batch_of(r.id) for r in (a, b)] == [0, 1]
    assert a.first_token_s == pytest.approx(P)
    assert b.first_token_s == pytest.approx(P + 10.5 * D + P)
    assert c.first_token_s == pytest.approx(2 * P + 11 * D + P)
    # before: c's prefill started when a's step ended beside b's prefill's first stage,
    # P + 10.5D + P/2 + D: its first token ~P/2 earlier
    assert c.first_token_s - c.arrival_s > 1.9 * P


def test_micro_batches_decode_side_by_side_one_stage_apart() -> None:
    """Two micro-batches decoding on two stages share them: each stage computes one step at
    a time, so the pipeline serves twice one micro-batch's tokens per second."""
    eng, loop = _pipeline(2)
    reqs = [SimRequest(i, 0, 0.0, PROMPT, 101) for i in range(2)]
    eng.submit_many(reqs)
    loop.run(until_s=10.0)
    # prefills: stage 0 at [0, P/2] then [P/2, P], stage 1 at [P/2, P] then [P, 3P/2]:
    # first tokens at P and 3P/2. The first micro-batch's first decode step waits at stage
    # 1 for the second's prefill (to 3P/2 + D/2); from then on the two alternate at each
    # stage, every step D
    assert [r.first_token_s for r in reqs] == pytest.approx([P, 1.5 * P])
    assert [r.done_s for r in reqs] == pytest.approx([1.5 * P + 99.5 * D, 1.5 * P + 100 * D])


def test_hops_separate_stages_and_hold_neither() -> None:
    hop = 2e-3
    eng, loop = _pipeline(4, hop_s=3 * hop)  # three hops on four stages
    reqs = [SimRequest(i, 0, 0.0, PROMPT, 1) for i in range(2)]
    eng.submit_many(reqs)
    loop.run(until_s=10.0)
    # the second micro-batch follows the first one stage-time behind at every stage (a hop
    # is shorter than a stage's share of a prefill here, so it never waits for a hop)
    assert hop < P / 4
    assert [r.first_token_s for r in reqs] == pytest.approx([P + 3 * hop, 1.25 * P + 3 * hop])


def test_a_split_pipeline_takes_work_at_its_decoding_head_next_step() -> None:
    """An instance decoding alone becomes a 2-stage pipeline (a FlexPipe split) mid-step: its
    head joins the shared stages at that step's end, so a request joining it then starts
    there (before this was handled, it waited for the head's next finished request)."""
    loop = EventLoop()
    spec = EngineSpec(COST, "both", 16, 10**6, 10**6)
    eng = ServingEngine(0, loop, spec, lambda e, r: None, lambda e, r: None)
    a = SimRequest(0, 0, 0.0, PROMPT, 1000)
    eng.submit(a)
    loop.schedule(P + 5.5 * D, Priority.CONTROL, 0, lambda: eng.set_micro_batches(2))
    b = SimRequest(1, 0, P + 5.75 * D, PROMPT, 10)  # micro-batch 1 (idle): prefills at once
    c = SimRequest(2, 0, P + 5.75 * D, PROMPT, 10)  # micro-batch 0, after a's step and b's
    loop.schedule(b.arrival_s, Priority.ARRIVAL, 1, lambda: eng.submit_many([b, c]))
    loop.run(until_s=1.0)
    assert [eng.micro_batch_of(r.id) for r in (a,)] == [0]
    assert b.first_token_s == pytest.approx(b.arrival_s + P)
    # c's prefill reaches stage 0 after b's share there, stage 1 after b's
    assert c.first_token_s == pytest.approx(b.arrival_s + 1.5 * P)
