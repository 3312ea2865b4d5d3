"""Pipelined prefill parity: requests that reach a pipeline of m micro-batches together are
spread over its micro-batches alike in `surge serve` (`runtime/pipeline_endpoint.py`
`PipelineEndpoint.submit`: one head engine per micro-batch) and in the simulator
(`sim/serving_engine.py`: one head engine per micro-batch too): both call
`policy.pipeline_batches.join_micro_batch`. Each micro-batch prefills its own requests and
the micro-batches follow each other through the stages (`sim/stage_line.py`), so on an
idle 4-stage pipeline a burst of four equal requests gets its first tokens after 4/4, 5/4,
6/4 and 7/4 of one request's prefill, as the runtime's head engines give them (FlexPipe
§9 on the emulated runtime, docs/emulation.md). Before, the simulator prefilled the burst as
one batch through every layer: every first token after four requests' prefill."""

import asyncio
from types import SimpleNamespace

import pytest

from surge.engine.sampling import SamplingParams
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.sim.costs import CostModel
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop
from surge.sim.request import SimRequest
from surge.sim.serving_engine import ServingEngine
from tests.parity.conftest import FakeClient

STAGES = 4
PROMPT = 512
COST = CostModel(1e-3, 1e-5, 1e-3, 1e-5, num_layers=8)


def _runtime_groups(bursts: list[int]) -> list[int]:
    """The head engine (micro-batch) each request of `bursts` (sizes, in order) joins; the
    earlier requests are still held."""
    ep = PipelineEndpoint(
        FakeClient(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        "m",
        "m-pipe",
        [(n, 2 * n, 2 * n + 2) for n in range(STAGES)],
        num_micro_batches=STAGES,
    )
    ep.groups = [  # type: ignore[list-item]
        SimpleNamespace(seqs={}, pending=[], wake=asyncio.Event()) for _ in range(STAGES)
    ]
    reqs = [SimpleNamespace(req_id=i, params=SamplingParams()) for i in range(sum(bursts))]
    for r in reqs:
        asyncio.run(ep.submit(r))  # type: ignore[arg-type]
    return [next(i for i, g in enumerate(ep.groups) if r in g.pending) for r in reqs]


def _sim(bursts: list[int]) -> tuple[ServingEngine, list[SimRequest], EventLoop]:
    """The simulator's pipelined engine given `bursts` (sizes, in order): each burst at
    once, the next 1 s later (the previous one's prefill over, its requests decoding: they
    run ~8 s)."""
    loop = EventLoop()
    spec = EngineSpec(COST, "both", 8 * STAGES, 10**6, 10**6)
    eng = ServingEngine(0, loop, spec, lambda e, r: None, lambda e, r: None)
    eng.set_micro_batches(STAGES)
    reqs: list[SimRequest] = []
    for size in bursts:
        burst = [SimRequest(len(reqs) + i, 0, loop.now_s, PROMPT, 1000) for i in range(size)]
        reqs += burst
        eng.submit_many(burst)
        loop.run(until_s=loop.now_s + 1.0)
        assert not eng.prefilling and eng.outstanding == len(reqs)
    return eng, reqs, loop


@pytest.mark.parametrize(
    "bursts",
    [[4], [6], [3, 3], [1, 1, 1, 1, 1]],
    ids=["one per micro-batch", "more than micro-batches", "two bursts", "one by one"],
)
def test_both_bodies_spread_requests_over_micro_batches_alike(bursts: list[int]) -> None:
    eng, reqs, _ = _sim(bursts)
    sim = [eng.micro_batch_of(r.id) for r in reqs]
    assert sim == _runtime_groups(bursts)


def test_a_burst_gets_its_first_tokens_one_stage_time_apart() -> None:
    _, reqs, _ = _sim([STAGES])
    one = COST.prefill_s(PROMPT)
    ttft = sorted(r.first_token_s - r.arrival_s for r in reqs)
    assert ttft == pytest.approx([one * (STAGES + j) / STAGES for j in range(STAGES)])
