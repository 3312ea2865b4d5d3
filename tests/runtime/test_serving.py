"""Serving on execution pipelines across agents: exactness, mode switch, member failure."""

import asyncio
from pathlib import Path

import pytest

from surge.engine.sampling import SamplingParams
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.server import Server
from tests.engine.reference import assert_same_tokens, hf_greedy
from tests.runtime.conftest import MODEL, connected

PROMPTS = [[0, 5, 9, 200, 31], [0, 8], [0, 3, 44, 55, 66, 77, 88, 99]]


def check_against_reference(tiny_hf: Path, reqs, max_tokens: int) -> None:
    for req in reqs:
        assert req.done.is_set() and len(req.output_token_ids) == max_tokens, req.req_id
        ref, logits = hf_greedy(tiny_hf, req.prompt_token_ids, max_tokens)
        assert_same_tokens(req.output_token_ids, ref, logits, f"{req.req_id} via {req.hops}")


async def ready_cluster(cluster, manifest):
    """Every node holds every block in its gpu tier."""
    every = list(range(manifest.num_blocks))
    loads = dict.fromkeys(range(cluster.config.num_nodes), every)
    return await connected(cluster, manifest, loads, tier="gpu")


@pytest.mark.parametrize(
    "stages",
    [[(0, 0, 2), (1, 2, 4)], [(0, 0, 1), (1, 1, 3), (2, 3, 4)]],
    ids=["2-stage", "3-stage"],
)
def test_pipeline_tokens_equal_a_full_instance(stages, make_cluster, manifest, tiny_hf) -> None:
    cluster = make_cluster(3, preload_engine=True)
    params = SamplingParams(max_tokens=16, ignore_eos=True)

    async def run():
        client = await ready_cluster(cluster, manifest)
        server = Server(client, MODEL)
        try:
            ep = PipelineEndpoint(client, manifest, MODEL, "p", stages, num_micro_batches=2)
            await ep.open()
            await server.add_endpoint(ep)
            reqs = [server.new_request(p, params) for p in PROMPTS * 2]
            for r in reqs:
                await server.submit(r)
            await server.wait_all(60)
            return reqs
        finally:
            await server.close()
            await client.close()

    reqs = asyncio.run(run())
    check_against_reference(tiny_hf, reqs, 16)
    assert all(r.hops == ["p"] for r in reqs)


def test_mode_switch_mid_generation_keeps_tokens(make_cluster, manifest, tiny_hf) -> None:
    cluster = make_cluster(3, preload_engine=True)
    params = SamplingParams(max_tokens=60, ignore_eos=True)

    async def run():
        client = await ready_cluster(cluster, manifest)
        server = Server(client, MODEL)
        try:
            ep = PipelineEndpoint(client, manifest, MODEL, "p", [(1, 0, 2), (2, 2, 4)])
            await ep.open()
            await server.add_endpoint(ep)
            reqs = [server.new_request(p, params) for p in PROMPTS]
            for r in reqs:
                await server.submit(r)
            while min(len(r.output_token_ids) for r in reqs) < 5:
                await asyncio.sleep(0.01)
            # Node 1 now "holds every block": it becomes a local instance and the
            # pipeline's requests move to it, rebuilding their KV cache by prefill.
            local = LocalEndpoint(client, 1, MODEL, "local-1")
            await local.open()
            await server.add_endpoint(local)
            moved = await server.retire("p")
            await server.wait_all(60)
            return reqs, moved
        finally:
            await server.close()
            await client.close()

    reqs, moved = asyncio.run(run())
    assert moved, "nothing was in flight at the switch"
    assert all(r.hops == ["p", "local-1"] for r in moved)
    check_against_reference(tiny_hf, reqs, 60)


def test_a_dead_pipeline_member_loses_no_request(make_cluster, manifest, tiny_hf) -> None:
    cluster = make_cluster(3, preload_engine=True)
    params = SamplingParams(max_tokens=60, ignore_eos=True)

    async def run():
        client = await ready_cluster(cluster, manifest)
        server = Server(client, MODEL)
        try:
            local = LocalEndpoint(client, 0, MODEL, "local-0")
            await local.open()
            ep = PipelineEndpoint(client, manifest, MODEL, "p", [(1, 0, 2), (2, 2, 4)])
            await ep.open()
            await server.add_endpoint(ep)
            reqs = [server.new_request(p, params) for p in PROMPTS]
            for r in reqs:
                await server.submit(r)
            while min(len(r.output_token_ids) for r in reqs) < 5:
                await asyncio.sleep(0.01)
            await server.add_endpoint(local)  # somewhere to go (gets no request until then)
            await asyncio.to_thread(cluster.kill, 2)
            await server.wait_all(60)
            return reqs
        finally:
            await server.close()
            await client.close()

    reqs = asyncio.run(run())
    assert all(r.hops[0] == "p" and r.hops[-1] == "local-0" for r in reqs)
    # Every token exactly once: the re-run continued from the tokens already produced.
    check_against_reference(tiny_hf, reqs, 60)


def test_scale_out_opens_pipelines_in_plan_order_and_switches_modes(
    make_cluster,
    manifest,
    tiny_hf,
) -> None:
    """Two GPU copies, four receivers: the start-up plan takes both copies as sources
    (K=2), the loading state machine opens the plan's execution pipelines as their stages
    fill, and retires each when a member holds everything (mode switch)."""
    from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
    from surge.policy.startup import Copy, Destination
    from surge.policy.systems import system_config
    from surge.runtime.scaleout import ControllerHooks, ScaleOutContext, run_scale_out

    num_nodes = 6
    cluster = make_cluster(num_nodes, link_gbps=0.1, preload_engine=True)
    outcome = plan_scale_out(
        MulticastRequest(num_nodes=num_nodes, num_blocks=manifest.num_blocks, num_sources=2)
    )
    assert outcome.pipelines, "the plan should predict execution pipelines"
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    served: list[int] = []

    async def on_local(node: int, ep) -> None:
        served.append(node)

    async def run():
        blocks = list(range(manifest.num_blocks))
        client = await connected(cluster, manifest, {0: blocks, 1: blocks}, tier="gpu")
        server = Server(client, MODEL)
        try:
            for src in (0, 1):
                ep = LocalEndpoint(client, src, MODEL, f"{MODEL}-node{src}")
                await ep.open()
                await server.add_endpoint(ep)
            reqs = [server.new_request(p, params) for p in PROMPTS * 4]
            for r in reqs:
                await server.submit(r)
            ctx = ScaleOutContext(
                client,
                server,
                manifest,
                system_config("lambdascale"),
                tuple(Destination(n) for n in range(2, num_nodes)),
                ControllerHooks(on_local=on_local),
                copies=(Copy(0, "gpu"), Copy(1, "gpu", outstanding=1)),
            )
            kind = await run_scale_out(ctx)
            await server.wait_all(120)
            return reqs, ctx, kind
        finally:
            await server.close()
            await client.close()

    reqs, ctx, kind = asyncio.run(run())
    assert kind == "hot" and ctx.report.sources == (0, 1)
    assert ctx.report.multicast is not None and ctx.report.multicast.complete_s is not None
    pipes = [name for name, _, nodes in ctx.report.opened if len(nodes) > 1]
    # Pipelines open in the order the plan predicts, and every one is retired by a mode switch.
    order = [int(name.split("-pipe")[1].split("-")[0]) for name in pipes]
    assert pipes and order == sorted(order)
    assert {p for p, _, _ in ctx.report.retired} == set(pipes)
    assert sorted(served) == list(range(2, num_nodes))
    check_against_reference(tiny_hf, reqs, 40)


def test_stage_layers_follow_the_agent_mapping(manifest) -> None:
    from surge.policy.multicast.pipelines import Pipeline
    from surge.policy.multicast.stage_cover import Stage
    from surge.runtime.scaleout import stage_layers

    pipe = Pipeline(step=3, stages=(Stage(1, 0, 1), Stage(2, 2, 3)), until_step=5)
    blocks = manifest.blocks
    want_layers = [(0, blocks[1].end_layer), (blocks[2].first_layer, manifest.arch.num_layers)]
    assert [s[1:] for s in stage_layers(manifest, pipe)] == want_layers
    # Plan node i is played by agents[i]: stages must open on those agents.
    assert [s[0] for s in stage_layers(manifest, pipe, [7, 4, 9])] == [4, 9]


def test_a_pipelines_stages_open_at_once(manifest) -> None:
    """`PipelineEndpoint.open` asks every stage at the same time (each builds its own
    runner): opened one after another, four quarter-core stages took 61 ms on the path to
    a scale-out's first new capacity."""

    class SlowAgents:
        """Answers each stage-open after 50 ms, counting how many are asked at once."""

        def __init__(self) -> None:
            self.in_flight = self.most_in_flight = 0
            self.asked: list[tuple[int, str]] = []

        async def call(self, node: int, op) -> None:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.asked.append((node, type(op).__name__))
            await asyncio.sleep(0.05)
            self.in_flight -= 1

    stages = [(1, 0, 1), (2, 1, 2), (3, 2, 3), (4, 3, 4)]

    async def run() -> SlowAgents:
        agents = SlowAgents()
        ep = PipelineEndpoint(agents, manifest, MODEL, "p", stages)  # type: ignore[arg-type]
        try:
            await ep.open()
        finally:
            for group in ep.groups:
                group.task.cancel()
        return agents

    agents = asyncio.run(run())
    assert sorted(agents.asked) == [(n, "StageOpenOp") for n, _, _ in stages]
    assert agents.most_in_flight == len(stages)
