"""A FlexPipe merge in the running runtime (head-engine tasks, the pipeline's step gate): a
sequence a retired engine is partway through prefilling (chunked) at the merge finishes
that prefill there and then joins the engine that stays, under `merge_gate`, so it decodes
in the same steps as that engine's sequences (`policy.flexpipe.merge.merge_move`,
`PipelineEndpoint.hand_over_prefilled`). Before, the retired engine kept it to its end,
decoding alone. The stages are faked: each step answers token 0 for each row after 2 ms."""

import asyncio
from types import SimpleNamespace

from surge.config import EngineConfig
from surge.engine.sampling import Sampled, SamplingParams
from surge.model.manifest import read_manifest
from surge.runtime.migration.refactor import FlexPipeline
from surge.runtime.pipeline_heads import SEQ_IDS_PER_GROUP
from surge.runtime.protocol import StageStepOp
from surge.runtime.request import ServeRequest

LONG_PROMPT = 40
"""Tokens of the prompt the retired engine prefills in pieces of 4 (8 with none decoding)."""


class StepClient:
    """Stages that answer every step with token 0; records each step's sequence ids."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.steps: list[tuple[int, ...]] = []

    async def call(self, node: int, op: object) -> None:
        return None

    async def call_bytes(self, node: int, op: object, body: object = None) -> tuple:
        if not isinstance(op, StageStepOp):
            return None, b""
        await asyncio.sleep(0.002)
        self.steps.append(tuple(op.batch.seq_ids))
        tokens = (0,) * sum(d is not None for d in op.draws)
        return SimpleNamespace(sampled=Sampled(tokens)), b""


def test_a_sequence_prefilling_at_a_merge_joins_the_engine_that_stays(tiny_store) -> None:
    manifest = read_manifest(tiny_store)
    client = StepClient(manifest.arch.vocab_size)
    config = EngineConfig(max_num_seqs=4, max_prefill_tokens=8, prefill_chunk_tokens=4)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    layers = manifest.arch.num_layers

    async def run() -> tuple[FlexPipeline, list[ServeRequest]]:
        pipe = FlexPipeline(client, manifest, "m", "fp", [(0, 0, layers)], config, 2, 2)  # type: ignore[arg-type]
        await pipe.open()
        short = [ServeRequest(f"s{i}", [5, 6, 7, 8], params) for i in range(2)]
        for r in short:  # one on each engine
            await pipe.submit(r)
        while any(len(r.output_token_ids) < 2 for r in short):
            await asyncio.sleep(0.001)
        long = ServeRequest("long", list(range(5, 5 + LONG_PROMPT)), params)
        retired = pipe.groups[1]
        retired.pending.append(long)
        retired.wake.set()
        while not any(s.num_cached > 0 for s in retired.engine.scheduler.running[1:]):
            await asyncio.sleep(0.001)
        async with pipe.gate.exclusive():  # the refactoring's switch
            partway = [s.num_cached for s in retired.engine.scheduler.running[1:]]
            pipe.set_micro_batches(1, batch_retired=True)
        assert 0 < partway[0] < LONG_PROMPT, partway
        reqs = [*short, long]
        await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs)), 60)
        for g in pipe.groups:
            if g.task is not None:
                g.task.cancel()
        return pipe, reqs

    pipe, reqs = asyncio.run(run())
    assert all(len(r.output_token_ids) == 40 for r in reqs)  # none lost
    long_id = SEQ_IDS_PER_GROUP + 1  # the retired engine's second sequence
    short_ids = {0, SEQ_IDS_PER_GROUP}  # both decode on the first engine after the merge
    # Its decode steps after its prefill are the engine that stays's: with the others.
    shared = [s for s in client.steps if long_id in s and short_ids & set(s)]
    assert len(shared) >= 30, client.steps
    assert not pipe.groups[1].after_prefill
