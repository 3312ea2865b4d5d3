"""FlexPipe merge parity: after a merge lowers a pipeline's micro-batch count, the head
engines past it hand their decoding sequences to the engines that stay alike in `surge
serve` (`runtime/pipeline_endpoint.py` `PipelineEndpoint.set_micro_batches(...,
batch_retired=True)`: the sequence keeps its id, so its K/V stays at the stages) and in the
simulator (`sim/serving_engine.py` `ServingEngine.set_micro_batches`, at each retired head's
next step boundary): both follow `policy.flexpipe.merge.adoptions`. So after a busy 4 -> 1
merge one decode step serves all four sequences (FlexPipe Alg. 1 line 15 activates the new
configuration; §7 Eq. 12 one micro-batch per stage), where before (and with
`FlexPipeSettings.batch_merged_sequences` False) the four engines took turns on the merged
stage, each step through every layer. A sequence partway through its (chunked) prefill at
the merge finishes it on its engine and then moves (`policy.flexpipe.merge.merge_move`):
before, the runtime kept it there to its end while the simulator moved it."""

import numpy as np
import pytest

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import Sampled, SamplingParams
from surge.model.manifest import read_manifest
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.pipeline_heads import SEQ_IDS_PER_GROUP, HeadGroup
from surge.sim.costs import CostModel
from surge.sim.decode_clock import PREFILL
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop, Priority
from surge.sim.request import SimRequest
from surge.sim.serving_engine import ServingEngine
from tests.parity.conftest import FakeClient

COST = CostModel(1e-3, 1e-5, 1e-3, 1e-5, num_layers=8)
ENGINES = 4
CASES = [(1, 1, 8), (2, 2, 3)]
"""(micro-batches after the merge, sequences each of the 4 engines holds, batch limit)."""
LONG_PROMPT = 12
"""Tokens of the prompt the last engine is partway through at the merge (pieces of 4)."""


class RecordingExecutor:
    """Runs no model: records each step's sequence ids, answers token 0 for each row."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.steps: list[tuple[int, ...]] = []

    def step(self, token_ids: np.ndarray, batch: BatchMeta, draws: tuple) -> Sampled:
        self.steps.append(tuple(batch.seq_ids))
        return Sampled((0,) * sum(d is not None for d in draws))

    def free(self, seq_ids: list[int]) -> None:
        return None


def _runtime(
    manifest, after: int, each: int, limit: int, batch: bool, partial: bool = False
) -> tuple[list[int], list[int]]:
    """A 4 -> `after` merge of head engines holding `each` decoding sequences each (and,
    `partial`, the last one also a sequence one piece into its chunked prefill): the
    sequences each engine decodes after it (once that prefill is done), and the sizes of
    the next step of every engine still holding some."""
    config = EngineConfig(
        max_num_seqs=limit, max_prefill_tokens=8, prefill_chunk_tokens=4, device="cpu"
    )
    ep = PipelineEndpoint(
        FakeClient(),  # type: ignore[arg-type]
        manifest,
        "m",
        "m-pipe",
        [(n, n, n + 1) for n in range(ENGINES)],
        config=config,
        num_micro_batches=ENGINES,
    )
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    executors = [RecordingExecutor(manifest.arch.vocab_size) for _ in range(ENGINES)]
    for g, executor in enumerate(executors):
        engine = LLMEngine(manifest, config, executor, first_seq_id=g * SEQ_IDS_PER_GROUP)  # type: ignore[arg-type]
        group = HeadGroup(engine)  # no task: the test steps the engines
        for i in range(each):
            sid = engine.add_request([5, 6, 7, 8], params)
            group.seqs[sid] = f"r{g}.{i}"  # type: ignore[assignment]
        engine.step()  # the prefill: every sequence decodes from here
        ep.groups.append(group)
    if partial:  # the last engine's next step is the first piece of a longer prompt
        sid = engine.add_request(list(range(5, 5 + LONG_PROMPT)), params)
        group.seqs[sid] = "long"  # type: ignore[assignment]
        engine.step()
        assert 0 < engine.seqs[sid].num_cached < LONG_PROMPT
    ep.rebalance_kv()
    ep.set_micro_batches(after, batch_retired=batch)
    for g in ep.groups[after:]:  # each retired engine's steps, as its `_run`'s deliver
        while any(s.num_tokens - s.num_cached > 1 for s in g.engine.scheduler.running):
            g.engine.step()
            if ep.prefills_done(g):
                ep.hand_over_prefilled(g)
    held = [len(g.engine.scheduler.running) for g in ep.groups]
    steps = []
    for g, executor in zip(ep.groups, executors, strict=True):
        if g.engine.has_unfinished:
            g.engine.step()
            steps.append(len(executor.steps[-1]))
            assert set(executor.steps[-1]) == set(g.seqs)  # each reaches its request
    return held, steps


def _sim(after: int, each: int, limit: int, batch: bool, partial: bool = False) -> list[int]:
    loop = EventLoop()
    spec = EngineSpec(COST, "both", limit * ENGINES, 10**6, 10**6)
    eng = ServingEngine(0, loop, spec, lambda e, r: None, lambda e, r: None)
    eng.set_micro_batches(ENGINES)
    eng.submit_many([SimRequest(i, 0, 0.0, 4, 50) for i in range(ENGINES * each)])
    loop.run(until_s=0.05)  # prefilled, decoding
    assert [len(h.running) for h in eng.heads] == [each] * ENGINES
    if partial:  # the merge comes while the last head prefills a longer prompt
        last = eng.heads[-1]
        last.submit(SimRequest(99, 0, loop.now_s, LONG_PROMPT, 50))
        until_s = loop.now_s
        while last.clock.phase != PREFILL:
            until_s += 1e-4
            loop.run(until_s=until_s)

    def merge() -> None:
        eng.max_batch = limit * after  # each head's limit stays `limit`, as sim/flexpipe's
        eng.set_micro_batches(after, after, batch)

    loop.schedule(loop.now_s, Priority.CONTROL, 0, merge)
    loop.run(until_s=loop.now_s + 0.02 + 0.02 * partial)  # every retired head past a boundary
    return [len(h.running) for h in eng.heads]


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "counterfactual"])
@pytest.mark.parametrize(("after", "each", "limit"), CASES, ids=["4->1", "4->2 limit 3"])
def test_both_bodies_hand_the_retired_engines_sequences_alike(
    tiny_store, after: int, each: int, limit: int, batch: bool
) -> None:
    manifest = read_manifest(tiny_store)
    runtime, steps = _runtime(manifest, after, each, limit, batch)
    assert _sim(after, each, limit, batch) == runtime
    if (after, each) == (1, 1):  # a busy 4 -> 1 merge
        # one step serves all four (on main, and in the counterfactual: four turns)
        assert steps == ([4] if batch else [1, 1, 1, 1])


@pytest.mark.parametrize(("after", "each", "limit"), CASES, ids=["4->1", "4->2 limit 3"])
def test_a_sequence_partway_through_its_prefill_moves_once_it_is_done(
    tiny_store, after: int, each: int, limit: int
) -> None:
    manifest = read_manifest(tiny_store)
    runtime, steps = _runtime(manifest, after, each, limit, True, partial=True)
    assert _sim(after, each, limit, True, partial=True) == runtime
    assert sum(runtime) == ENGINES * each + 1  # none lost
    if (after, each) == (1, 1):  # on main the runtime's last engine kept it: [4, 0, 0, 1]
        assert runtime == [5, 0, 0, 0] and steps == [5]
