"""GPU-time emulation on real agents: loads take D times the emulated model's time over the
emulated links, engine steps last D times the emulated GPU's step, and a small emulated
scale-out serves every request with each node's paced steps counted (docs/emulation.md)."""

import asyncio
import time

import pytest

from surge.config import COMPILE_DECODE_ENV
from surge.emulation import Emulation, EmulationConfig, StepPacer
from surge.engine.sampling import SamplingParams
from surge.policy.startup import Copy, Destination
from surge.policy.systems import system_config
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.launch.agent_process import agent_argv
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.protocol import LoadOp, RegisterOp, StatusOp
from surge.runtime.scaleout import ControllerHooks, ScaleOutContext, run_scale_out
from surge.runtime.server import Server
from tests.runtime.conftest import MODEL

SPEC = "lambdascale-testbed1:llama2-7b"
D = 4.0
"""llama2-7b on an H800: a decode step ~6 ms and the model over 400 Gb/s ~0.27 s, x4 here."""


def emulated(manifest) -> Emulation:
    return Emulation.for_store(EmulationConfig.parse(SPEC, D), manifest)


async def status(client, nodes):
    return {n: await client.call(n, StatusOp()) for n in nodes}


@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_loads_and_steps_take_the_emulated_time(make_cluster, manifest) -> None:
    emu = emulated(manifest)
    cluster = make_cluster(1, emulation=emu, preload_engine=True)
    pacer = StepPacer(emu.config.profile, "H800", D)
    layers = manifest.arch.num_layers
    prompt, max_tokens = list(range(5, 17)), 24
    # The registry's rate (Testbed1: the 400 Gb/s NIC), scaled by real / emulated bytes.
    expected_load_s = D * emu.config.profile.total_bytes / (400e9 / 8)
    expected_gen_s = (
        pacer.emulated_s([len(prompt)], 0, layers, layers)
        + (max_tokens - 1) * pacer.emulated_s([1], 0, layers, layers)
    ) * D

    async def run():
        client = cluster.client()
        await client.connect()
        await cluster.wire_peers(client)
        await client.broadcast(RegisterOp(model=MODEL, manifest=manifest))
        server = Server(client, MODEL)
        try:
            t0 = time.monotonic()
            blocks = tuple(range(manifest.num_blocks))
            await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="gpu"))
            load_s = time.monotonic() - t0
            ep = LocalEndpoint(client, 0, MODEL, "i0")
            await ep.open()
            await server.add_endpoint(ep)
            req = server.new_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            t1 = time.monotonic()
            await server.submit(req)
            await asyncio.wait_for(req.done.wait(), 60)
            return load_s, req.done_t - t1, (await status(client, [0]))[0]
        finally:
            await server.close()
            await client.close()

    load_s, gen_s, st = asyncio.run(run())
    assert expected_load_s * 0.9 <= load_s <= expected_load_s * 2 + 2.0
    assert gen_s >= expected_gen_s * 0.95
    assert st.emulated_steps == max_tokens  # one prefill, then a decode per further token
    assert 0 <= st.emulation_violations <= st.emulated_steps


def test_an_emulated_scale_out_serves_every_request(make_cluster, manifest) -> None:
    """One hot node scales out to two more over the emulated links (λScale, serve while
    loading); bounded in time, every agent stopped and checked clean by the fixture."""
    cluster = make_cluster(3, emulation=emulated(manifest), preload_engine=True)
    params = SamplingParams(max_tokens=4, ignore_eos=True)

    async def serving(node: int, ep: LocalEndpoint) -> None:
        """A destination serves alone (no controller to tell)."""

    async def run():
        client = cluster.client()
        await client.connect()
        await cluster.wire_peers(client)
        await client.broadcast(RegisterOp(model=MODEL, manifest=manifest))
        blocks = tuple(range(manifest.num_blocks))
        await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="gpu"))
        server = Server(client, MODEL)
        try:
            hot = LocalEndpoint(client, 0, MODEL, f"{MODEL}-node0", capacity=2)
            await hot.open()
            await server.add_endpoint(hot)
            reqs = [server.new_request([7 + i, 8, 9, 10], params) for i in range(12)]
            ctx = ScaleOutContext(
                client,
                server,
                manifest,
                system_config("lambdascale"),
                (Destination(1), Destination(2)),
                ControllerHooks(on_local=serving),
                copies=(Copy(0, "gpu"),),
                timeout_s=60,
            )
            scaling = asyncio.get_running_loop().create_task(run_scale_out(ctx))
            for r in reqs:
                await server.submit(r)
            await asyncio.wait_for(scaling, 60)
            await server.wait_all(60)
            return reqs, ctx, await status(client, [0, 1, 2])
        finally:
            await server.close()
            await client.close()

    reqs, ctx, st = asyncio.run(run())
    assert all(len(r.output_token_ids) == 4 for r in reqs)
    assert ctx.report.opened, "the scale-out opened no endpoint"
    assert ctx.report.multicast is not None and ctx.report.multicast.complete_s is not None
    # The multicast moved the emulated model: at least D x its time over one 400 Gb/s link.
    assert (
        ctx.report.multicast.complete_s
        >= 0.9 * D * emulated(manifest).config.profile.total_bytes / 50e9
    )
    assert st[0].emulated_steps > 0 and sum(s.emulated_steps for s in st.values()) > 0
    for s in st.values():
        assert 0 <= s.emulation_violations <= s.emulated_steps


@pytest.mark.parametrize("bad", ["lambdascale-testbed1", "nope:llama2-7b"])
def test_bad_emulation_specs_are_refused(bad: str) -> None:
    from surge.errors import SurgeError

    with pytest.raises(SurgeError, match="PRESET:MODEL"):
        EmulationConfig.parse(bad)


def test_emulated_agents_decode_eager_whatever_the_default(manifest, monkeypatch) -> None:
    """A compile started as an agent receives its layers ran during the scale-out on the
    shared cores and doubled the emulated multicast (docs/emulation.md): an emulated
    agent's decode is eager even where the default compiles; a plain one keeps it."""
    monkeypatch.delenv(COMPILE_DECODE_ENV, raising=False)  # the suite turns it off
    plain = LocalCluster(LocalClusterConfig(num_nodes=2))
    assert plain.agent_config(0).engine.compile_decode
    cluster = LocalCluster(LocalClusterConfig(num_nodes=2, emulation=emulated(manifest)))
    for node in range(2):
        agent = cluster.agent_config(node)
        assert agent.emulate == SPEC and not agent.engine.compile_decode
        assert "--no-compile-decode" in agent_argv(agent)
