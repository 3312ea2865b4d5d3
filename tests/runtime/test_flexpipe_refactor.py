"""FlexPipe inflight refactoring on real agents: a live pipeline split (1 -> 3 stages) and
merged (3 -> 1) while requests generate, token-exact against a local greedy run; a new node
killed while a split loads leaves the old stages serving, an old member killed during a merge
fails the pipeline and its requests finish elsewhere — none lost."""

import asyncio
import contextlib

from surge.config import EngineConfig
from surge.engine.sampling import SamplingParams
from surge.policy.systems import serve_system
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.refactor import FlexPipeline, blocks_of_stage, refactor_pipeline
from surge.runtime.protocol import LoadOp, StageProfileOp
from surge.runtime.scaleout.flexpipe import micro_batches
from surge.runtime.server import Server
from tests.runtime.conftest import MODEL, connected, record_ops
from tests.runtime.test_serving import PROMPTS, check_against_reference

MAX_TOKENS = 160
"""Long enough that requests are still decoding when a refactoring (or a kill) lands: with
48, the kill test's requests had all finished at the kill once batch-1 decode got faster
(surge's one-row kernel)."""
SYSTEM = serve_system("flexpipe")


def _loader(client, source: str = "remote"):
    async def load(node: int, blocks: list[int]) -> None:
        await client.call(node, LoadOp(MODEL, tuple(blocks), tier="gpu", source=source))

    return load


async def _until_tokens(reqs, n: int | list[int], timeout_s: float = 120.0) -> None:
    """Until each request has `n` tokens (one count, or one per request) or has finished.
    Bounded: a request that finished short of its count (generation outran a refactoring's
    loads on a loaded machine) must fail the test's assertions, not hang it."""
    counts = [n] * len(reqs) if isinstance(n, int) else n

    async def wait() -> None:
        pairs = list(zip(reqs, counts, strict=True))
        while any(len(r.output_token_ids) < c and not r.done.is_set() for r, c in pairs):
            await asyncio.sleep(0.005)

    await asyncio.wait_for(wait(), timeout_s)


@contextlib.asynccontextmanager
async def _serving(cluster, manifest, loads: dict[int, list[int]], stages, params):
    """A FlexPipeline over `stages` serving every prompt, each with >= 2 tokens already."""
    client = await connected(cluster, manifest, loads, "gpu")
    server = Server(client, MODEL)
    try:
        micro, most = micro_batches(SYSTEM, manifest, EngineConfig(), len(stages))
        pipe = FlexPipeline(client, manifest, MODEL, "fp", stages, EngineConfig(), micro, most)
        await pipe.open()
        await server.add_endpoint(pipe)
        reqs = [server.new_request(p, params) for p in PROMPTS]
        for r in reqs:
            await server.submit(r)
        await _until_tokens(reqs, 2)
        yield client, server, pipe, reqs
    finally:
        await server.close()
        await client.close()


def test_split_then_merge_mid_generation_is_token_exact(make_cluster, manifest, tiny_hf) -> None:
    cluster = make_cluster(3, preload_engine=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    L = manifest.arch.num_layers
    through_controller: set[str] = set()

    async def run():
        loads = {0: list(range(manifest.num_blocks))}
        async with _serving(cluster, manifest, loads, [(0, 0, L)], params) as live:
            client, server, pipe, reqs = live
            # Which ops pass through the controller: K/V must go agent to agent (kv_push).
            record_ops(client, through_controller.add)
            await _until_tokens(reqs, 3)
            fine = [(0, 0, 1), (1, 1, 3), (2, 3, L)]
            micro = micro_batches(SYSTEM, manifest, EngineConfig(), 3)[0]
            split = await refactor_pipeline(pipe, fine, _loader(client), num_micro_batches=micro)
            at_split = [len(r.output_token_ids) for r in reqs]
            groups = [pipe.num_micro_batches, len(pipe.groups)]
            # Requests after the split go to the new micro-batch groups, on the new stages.
            late = [server.new_request(p, params) for p in PROMPTS[:2]]
            for r in late:
                await server.submit(r)
            late_groups = {
                i
                for i, g in enumerate(pipe.groups)
                for r in late
                if r in [*g.pending, *g.seqs.values()]
            }
            profile = await client.call(1, StageProfileOp(pipeline=pipe.stage_key))
            # Three more tokens each since the split (the late ones: three), then merge.
            await _until_tokens(reqs + late, [n + 3 for n in at_split] + [3] * len(late))
            micro = micro_batches(SYSTEM, manifest, EngineConfig(), 1)[0]
            merge = await refactor_pipeline(
                pipe, [(1, 0, L)], _loader(client), num_micro_batches=micro, batch_retired=True
            )
            at_merge = [len(r.output_token_ids) for r in reqs + late]
            groups.append(pipe.num_micro_batches)
            held = [len(g.seqs) + len(g.pending) for g in pipe.groups]
            await server.wait_all(60)
            await pipe.settle_kv()  # the drained groups give their KV back
            budgets = [g.budget_pages for g in pipe.groups]
            reqs += late
            return (
                reqs,
                split,
                merge,
                at_split,
                at_merge,
                profile,
                pipe,
                groups,
                late_groups,
                budgets,
                held,
            )

    reqs, split, merge, at_split, at_merge, profile, pipe, groups, late_groups, budgets, held = (
        asyncio.run(run())
    )
    # The head keeps one micro-batch per stage (§7 Eq. 12): 3 groups once split, the new
    # ones took the late requests; 1 takes requests once merged, and gets the whole cache
    # back when the others drained.
    assert groups == [3, 3, 1], groups
    assert late_groups == {1, 2}, late_groups
    assert budgets == [EngineConfig().num_pages, 0, 0], budgets
    # Both happened mid-generation: every request had tokens and had more to come.
    assert all(0 < n < MAX_TOKENS for n in at_split + at_merge), (at_split, at_merge)
    assert (split.direction, split.num_stages_before, split.num_stages_after) == ("split", 1, 3)
    assert (merge.direction, merge.num_stages_before, merge.num_stages_after) == ("merge", 3, 1)
    # K/V of the moved layers crossed the transport (no request recomputed: one hop each).
    assert split.num_seqs == len(PROMPTS) and split.kv_bytes > 0 and split.num_kv_copies > 0
    # §6.3: the K/V moved while the old stages served; the pause carried only the tokens
    # generated since (each request's few newest), not the K/V of every token.
    for r in (split, merge):
        assert r.kv_bytes_paused < r.kv_bytes and r.precopy_s > 0, r
    # The merge handed the retired groups' sequences, K/V in place, to the one that stays
    # (FlexPipe Alg. 1 line 15, `policy.flexpipe.merge`): one batch, still token-exact.
    assert held[1:] == [0, 0] and held[0] > 0, held
    # The merge moved the late requests' K/V too.
    assert merge.num_seqs == len(PROMPTS) + 2 and merge.kv_bytes > 0
    # ... directly between agents: the controller only asked for it.
    assert "KvPushOp" in through_controller, through_controller
    assert not {"KvExportOp", "KvImportOp"} & through_controller, through_controller
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
        loads = {0: list(range(manifest.num_blocks))}
        async with _serving(cluster, manifest, loads, [(0, 0, L)], params) as live:
            client, server, pipe, reqs = live
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

    reqs, error, pipe = asyncio.run(run())
    assert error is not None
    assert pipe.nodes == (0,) and pipe.version == 0 and not pipe.failed
    check_against_reference(tiny_hf, reqs, MAX_TOKENS)


def test_old_member_killed_during_a_merge_loses_no_request(make_cluster, manifest, tiny_hf) -> None:
    """An old member (node 1, leaving in the merge) dies while node 0 loads its layers: the
    merge fails, the pipeline fails with it, and its requests move to the local instance on
    node 2, which re-runs them from their tokens (token-exact, none lost)."""
    cluster = make_cluster(3, preload_engine=True, remote_gbps=0.05)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    L = manifest.arch.num_layers
    head, tail = blocks_of_stage(manifest, 0, 2), blocks_of_stage(manifest, 2, L)

    async def run():
        loads = {0: head, 1: tail, 2: list(range(manifest.num_blocks))}
        stages = [(0, 0, 2), (1, 2, L)]
        async with _serving(cluster, manifest, loads, stages, params) as live:
            client, server, pipe, reqs = live
            local = LocalEndpoint(client, 2, MODEL, "local-2")
            await local.open()
            await server.add_endpoint(local)
            task = asyncio.ensure_future(refactor_pipeline(pipe, [(0, 0, L)], _loader(client)))
            await asyncio.sleep(0.15)
            assert not task.done()  # node 0 still loads the tail's blocks
            at_kill = [len(r.output_token_ids) for r in reqs]
            await asyncio.to_thread(cluster.kill, 1)
            error = None
            try:
                await task
            except Exception as e:  # the merge fails with its member
                error = e
            await server.wait_all(60)
            return reqs, error, pipe, at_kill

    reqs, error, pipe, at_kill = asyncio.run(run())
    assert error is not None
    assert pipe.failed and pipe.version == 0
    assert all(0 < n < MAX_TOKENS for n in at_kill), at_kill
    assert all(r.hops[0] == "fp" and r.hops[-1] == "local-2" for r in reqs), [r.hops for r in reqs]
    check_against_reference(tiny_hf, reqs, MAX_TOKENS)
