"""λScale §5 warm start in `surge serve`: three nodes hold the model in host memory; each
loads it into its GPU tier in its group's rotated order, and the three serve as one
execution pipeline before any holds the whole model, then each alone (the pipeline
retired with its requests spread over them); every request token-exact. Loads are paced
by the GPU-time emulation: on the tiny model alone they are so fast that a node is whole
before the others hold their segments, and then no pipeline is worth opening."""

import asyncio
from dataclasses import replace

from surge.config import EngineConfig
from surge.emulation import Emulation, EmulationConfig
from surge.engine.sampling import SamplingParams
from surge.policy.startup import Destination
from surge.policy.systems import system_config
from surge.runtime.scaleout import ControllerHooks, ScaleOutContext, run_scale_out
from surge.runtime.server import Server
from tests.runtime.conftest import MODEL, connected
from tests.runtime.test_emulation import SPEC
from tests.runtime.test_serving import PROMPTS, check_against_reference

MAX_TOKENS = 4


def test_warm_nodes_serve_as_a_pipeline_while_they_load(make_cluster, manifest, tiny_hf) -> None:
    # Emulated (llama2-7b on Testbed1, D=16): each block takes ~2 s host -> GPU, so the
    # nodes hold their segments well before any holds the whole model, even on a busy host.
    emulation = Emulation.for_store(EmulationConfig.parse(SPEC, 16.0), manifest)
    cluster = make_cluster(3, emulation=emulation, preload_engine=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    every = list(range(manifest.num_blocks))

    async def on_local(node: int, ep) -> None:
        return None

    async def run():
        client = await connected(cluster, manifest, {n: every for n in range(3)}, tier="host")
        server = Server(client, MODEL)
        try:
            reqs = [server.new_request(p, params) for p in PROMPTS]
            for r in reqs:  # waiting before anything serves
                await server.submit(r)
            ctx = ScaleOutContext(
                client,
                server,
                manifest,
                replace(system_config("lambdascale"), num_blocks=manifest.num_blocks),
                tuple(Destination(n, own_tier="host") for n in range(3)),
                ControllerHooks(on_local=on_local),
                engine=EngineConfig(max_num_seqs=4),
            )
            kind = await run_scale_out(ctx)
            await server.wait_all(60)
            return kind, reqs, ctx.report
        finally:
            await server.close()
            await client.close()

    kind, reqs, report = asyncio.run(run())
    assert kind == "warm"
    first, *rest = report.opened
    assert "-pipe0-warm" in first[0] and sorted(first[2]) == [0, 1, 2], report.opened
    assert sorted(n for _, _, nodes in rest for n in nodes) == [0, 1, 2]  # then each alone
    assert [name for name, _, _ in report.retired] == [first[0]]
    check_against_reference(tiny_hf, reqs, MAX_TOKENS)
