"""FlexPipe inflight refactoring on real agents: a live pipeline split (1 -> 3 stages) and
merged (3 -> 1) while requests generate, token-exact against a local greedy run; a node
killed while a split loads leaves the old stages serving and every request finishes."""

import asyncio

from surge.engine.sampling import SamplingParams
from surge.runtime.protocol import LoadOp
from surge.runtime.protocol_ops import StageProfileOp
from surge.runtime.refactor import FlexPipeline, refactor_pipeline
from surge.runtime.server import Server
from tests.runtime.conftest import MODEL, connected
from tests.runtime.test_serving import PROMPTS, check_against_reference

MAX_TOKENS = 48


def _loader(client, source: str = "remote"):
    async def load(node: int, blocks: list[int]) -> None:
        await client.call(node, LoadOp(MODEL, tuple(blocks), tier="gpu", source=source))

    return load


async def _until_tokens(reqs, n: int) -> None:
    while min(len(r.output_token_ids) for r in reqs) < n:
        await asyncio.sleep(0.005)


def test_split_then_merge_mid_generation_is_token_exact(make_cluster, manifest, tiny_hf) -> None:
    cluster = make_cluster(3, preload_engine=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    L = manifest.arch.num_layers

    async def run():
        client = await connected(cluster, manifest, {0: list(range(manifest.num_blocks))}, "gpu")
        server = Server(client, MODEL)
        try:
            pipe = FlexPipeline(client, manifest, MODEL, "fp", [(0, 0, L)])
            await pipe.open()
            await server.add_endpoint(pipe)
            reqs = [server.new_request(p, params) for p in PROMPTS]
            for r in reqs:
                await server.submit(r)
            await _until_tokens(reqs, 3)
            fine = [(0, 0, 1), (1, 1, 3), (2, 3, L)]
            split = await refactor_pipeline(pipe, fine, _loader(client))
            at_split = [len(r.output_token_ids) for r in reqs]
            profile = await client.call(1, StageProfileOp(pipeline=pipe.stage_key))
            await _until_tokens(reqs, max(at_split) + 3)
            merge = await refactor_pipeline(pipe, [(1, 0, L)], _loader(client))
            at_merge = [len(r.output_token_ids) for r in reqs]
            await server.wait_all(60)
            return reqs, split, merge, at_split, at_merge, profile, pipe
        finally:
            await server.close()
            await client.close()

    reqs, split, merge, at_split, at_merge, profile, pipe = asyncio.run(run())
    # Both happened mid-generation: every request had tokens and had more to come.
    assert all(0 < n < MAX_TOKENS for n in at_split + at_merge), (at_split, at_merge)
    assert (split.direction, split.num_stages_before, split.num_stages_after) == ("split", 1, 3)
    assert (merge.direction, merge.num_stages_before, merge.num_stages_after) == ("merge", 3, 1)
    # K/V of the moved layers crossed the transport (no request recomputed: one hop each).
    assert split.num_seqs == len(PROMPTS) and split.kv_bytes > 0 and split.num_kv_copies > 0
    assert merge.num_seqs == len(PROMPTS) and merge.kv_bytes > 0
    assert all(r.hops == ["fp"] for r in reqs), [r.hops for r in reqs]
    assert pipe.nodes == (1,) and pipe.version == 2
    check_against_reference(tiny_hf, reqs, MAX_TOKENS)
    # The node's profile covers its stage's layers with positive times.
    assert profile.first_layer == 1 and len(profile.prefill_s) == 2
    assert min(profile.prefill_s) > 0 and profile.activation_bytes_per_token > 0


def test_node_killed_during_a_split_leaves_the_old_stages_serving(
    make_cluster, manifest, tiny_hf
) -> None:
    # The registry at 0.05 Gbit/s: the new node's blocks take ~0.5 s, the kill lands then.
    cluster = make_cluster(2, preload_engine=True, remote_gbps=0.05)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    L = manifest.arch.num_layers

    async def run():
        client = await connected(cluster, manifest, {0: list(range(manifest.num_blocks))}, "gpu")
        server = Server(client, MODEL)
        try:
            pipe = FlexPipeline(client, manifest, MODEL, "fp", [(0, 0, L)])
            await pipe.open()
            await server.add_endpoint(pipe)
            reqs = [server.new_request(p, params) for p in PROMPTS]
            for r in reqs:
                await server.submit(r)
            await _until_tokens(reqs, 2)
            task = asyncio.ensure_future(
                refactor_pipeline(pipe, [(0, 0, 2), (1, 2, L)], _loader(client))
            )
            await asyncio.sleep(0.15)
            assert not task.done()
            await asyncio.to_thread(cluster.kill, 1)
            error = None
            try:
                await task
            except Exception as e:  # the split fails; the pipeline must not
                error = e
            await server.wait_all(60)
            return reqs, error, pipe
        finally:
            await server.close()
            await client.close()

    reqs, error, pipe = asyncio.run(run())
    assert error is not None
    assert pipe.nodes == (0,) and pipe.version == 0 and not pipe.failed
    check_against_reference(tiny_hf, reqs, MAX_TOKENS)
