"""A pipeline's last stage picks the tokens (`StageStepOp.draws`, `engine/sampling.py`
`sample`): seeded requests get the same tokens, and the logprobs they ask for, as a single
local instance serving them with the same seeds; and when a sequence's last stage changes
mid-generation (a λScale §4.4 mode switch: it continues on a local instance; a FlexPipe
refactoring, a consolidation or a failover continue it elsewhere the same way) it goes on
exactly as an uninterrupted run. A sampled token's generator is seeded by the sequence's
seed and the token's position, so no generator state lives anywhere between steps: none to
move, none to free (`StageFreeOp` frees K/V only). Before, the head engine in the
controller sampled from logits shipped back, and a moved sequence restarted its seed's
stream from its first draw."""

import asyncio

import pytest

from surge.engine.sampling import SamplingParams
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.server import Server
from tests.runtime.conftest import MODEL
from tests.runtime.test_serving import PROMPTS, ready_cluster

MAX_TOKENS = 60
SAMPLED = [
    SamplingParams(MAX_TOKENS, 1.0, top_p=0.9, top_k=40, seed=5, ignore_eos=True, logprobs=2),
    SamplingParams(MAX_TOKENS, 0.8, seed=6, ignore_eos=True),
    SamplingParams(MAX_TOKENS, 1.0, seed=7, ignore_eos=True),
    SamplingParams(MAX_TOKENS, 1.0, top_p=0.9, top_k=40, seed=8, ignore_eos=True, logprobs=2),
]
"""One per prompt (the last: the first prompt with another seed)."""


def test_seeded_sampling_on_a_pipeline_equals_a_single_engine(make_cluster, manifest) -> None:
    cluster = make_cluster(3, preload_engine=True)
    prompts = [*PROMPTS, PROMPTS[0]]

    async def serve(server: Server) -> list:
        reqs = [server.new_request(p, sp) for p, sp in zip(prompts, SAMPLED, strict=True)]
        for r in reqs:
            await server.submit(r)
        return reqs

    async def run():
        client = await ready_cluster(cluster, manifest)
        server = Server(client, MODEL)
        try:
            local = LocalEndpoint(client, 0, MODEL, "local-0")
            await local.open()
            await server.add_endpoint(local)
            alone = await serve(server)  # a single local instance
            await server.wait_all(60)
            await server.retire("local-0")
            ep = PipelineEndpoint(client, manifest, MODEL, "p", [(1, 0, 2), (2, 2, 4)])
            await ep.open()
            await server.add_endpoint(ep)
            piped = await serve(server)  # the pipeline, to the end
            await server.wait_all(60)
            switched = await serve(server)  # the pipeline, then a local instance
            while min(len(r.output_token_ids) for r in switched) < 5:
                await asyncio.sleep(0.01)
            local1 = LocalEndpoint(client, 1, MODEL, "local-1")
            await local1.open()
            await server.add_endpoint(local1)
            moved = await server.retire("p", ("local-1",))  # λScale §4.4 mode switch
            await server.wait_all(60)
            return alone, piped, switched, moved
        finally:
            await server.close()
            await client.close()

    alone, piped, switched, moved = asyncio.run(run())
    assert all(r.hops == ["local-0"] for r in alone) and all(r.hops == ["p"] for r in piped)
    assert moved, "nothing was in flight at the switch"
    assert all(r.hops == ["p", "local-1"] for r in moved)
    for a, p, s in zip(alone, piped, switched, strict=True):
        assert len(a.output_token_ids) == MAX_TOKENS
        assert p.output_token_ids == a.output_token_ids, p.params
        assert s.output_token_ids == a.output_token_ids, (s.params, s.hops)
        assert sorted(p.logprobs) == sorted(a.logprobs) == sorted(s.logprobs)
        for i, lp in a.logprobs.items():
            for other in (p.logprobs[i], s.logprobs[i]):
                assert other.logprob == pytest.approx(lp.logprob, abs=1e-5)
                assert [t for t, _ in other.top] == [t for t, _ in lp.top]
    assert len(alone[0].logprobs) == MAX_TOKENS and not alone[1].logprobs
    assert alone[3].output_token_ids != alone[0].output_token_ids, "another seed, other tokens"
