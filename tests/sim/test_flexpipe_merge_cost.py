"""What a FlexPipe merge costs the requests in flight (docs/flexpipe.md "Measured").

A pipeline of η stages runs η head engines, one per micro-batch (`sim/serving_engine.py`,
as the runtime's `PipelineEndpoint`); a merge to fewer stages keeps the heads past the new
micro-batch count until they have finished what they hold (`set_micro_batches`, as the
runtime's refactor_pipeline switch). On the merged stages those heads step in turn, each
step through every layer, so a request they hold gets one token per η' steps of its own
head instead of one per step. Measured on flexpipe_cv.py's 13b CV-8 trace (seed 1): the
slowest 1% are all on five 4 -> 1 merges of busy groups (decode 10-11 s for 128 tokens,
p50 2.5 s), e2e p99 11.14 s; with busy groups never merging (a counterfactual) 4.39 s."""

import pytest

from surge.sim.costs import CostModel
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop, Priority
from surge.sim.request import SimRequest
from surge.sim.serving_engine import ServingEngine

COST = CostModel(1e-3, 1e-5, 1e-3, 1e-5, num_layers=8)
TOKENS = 401


def _four_micro_batches(merge_at_s: float | None, batch: bool = False) -> list[SimRequest]:
    """Four requests, one per micro-batch of a 4-stage pipeline; merged to one stage (one
    micro-batch) at `merge_at_s` (None: never), `batch`: the retired heads hand their
    requests over. Their completion times."""
    loop = EventLoop()
    eng = ServingEngine(
        0, loop, EngineSpec(COST, "both", 32, 10**6, 10**6), *(lambda e, r: None,) * 2
    )
    eng.set_micro_batches(4)
    reqs = [SimRequest(i, 0, 0.0, 64, TOKENS) for i in range(4)]
    eng.submit_many(reqs)
    if merge_at_s is not None:
        loop.schedule(merge_at_s, Priority.CONTROL, 0, lambda: eng.set_micro_batches(1, 1, batch))
    loop.run(until_s=100.0)
    assert [eng.micro_batch_of(r.id) for r in reqs] == [None] * 4  # all done
    return reqs


def test_a_merge_makes_the_retired_micro_batches_take_turns_on_the_merged_stage() -> None:
    merge_s = 1.0  # about 120 of the 400 decode steps done (D ~ 8 ms)
    kept = _four_micro_batches(None)
    merged = _four_micro_batches(merge_s)
    left_kept = [r.done_s - merge_s for r in kept]
    left_merged = [r.done_s - merge_s for r in merged]
    # each of the four heads steps through every layer on the one stage in turn: 4x the
    # time per token (one engine would run the four as one batch at ~1x: decode_s(4) ~ D)
    for a, b in zip(left_merged, left_kept, strict=True):
        assert a / b == pytest.approx(4.0, rel=0.03)
    assert COST.decode_s(4) / COST.decode_s(1) < 1.05


def test_a_batching_merge_serves_the_retired_micro_batches_in_one_step() -> None:
    """`batch_retired` (FlexPipeSettings.batch_merged_sequences, FlexPipe Alg. 1 line 15):
    at their next step boundary the retired heads hand their requests to the one that stays,
    so one step serves all four, at about the never-merged pace, and no token is lost."""
    merge_s = 1.0
    kept = _four_micro_batches(None)
    merged = _four_micro_batches(merge_s, batch=True)
    for a, b in zip(merged, kept, strict=True):
        assert (a.done_s - merge_s) / (b.done_s - merge_s) == pytest.approx(1.0, abs=0.05)
        assert a.generated == TOKENS
