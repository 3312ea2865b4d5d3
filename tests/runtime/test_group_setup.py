"""The NCCL baseline's group creation in `surge serve` (λScale §7.2, BlitzScale §5): with the
`blocks` transport a scale-out by a system with a set-up cost (`SystemConfig.group_setup_s`)
waits that long on the serving clock before its multicast plans and moves its first block,
as the simulator's loader does (`sim/loading.py`), and a system without one starts at once;
the `nccl` system itself (`gloo` transport) waits nothing modelled: it creates a real gloo
group, whose measured creation is its set-up, and moves the model through it; under
emulation (`paced_setups`) no block moves before the system's `group_setup_s` has passed on
the serving clock (`NCCL_GROUP_SETUP_S`, the simulator's charge)."""

import asyncio
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from surge.config import EngineConfig
from surge.policy.startup import Copy, Destination
from surge.policy.systems import NCCL_GROUP_SETUP_S, system_config
from surge.runtime.clock import Clock
from surge.runtime.protocol import BlockArrived
from surge.runtime.scaleout import ControllerHooks, ScaleOutContext, run_scale_out
from surge.runtime.scaleout.multicast import group_setup_floor_s
from surge.runtime.server import Server
from tests.runtime.conftest import MODEL, connected

SETUP_S = 0.5


async def _on_local(node: int, ep) -> None:
    """The destination serves alone (no controller here)."""


@pytest.mark.parametrize("setup_s", [0.0, SETUP_S])
@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_a_multicast_waits_for_its_group_on_the_serving_clock(
    setup_s, make_cluster, manifest
) -> None:
    cluster = make_cluster(2, link_gbps=1.0)
    waited: list[float] = []

    async def sleep(real_s: float) -> None:
        waited.append(real_s)
        await asyncio.sleep(real_s)

    system = replace(system_config("nccl"), multicast_transport="blocks", group_setup_s=setup_s)

    async def run() -> float:
        whole = {0: list(range(manifest.num_blocks))}
        client = await connected(cluster, manifest, whole, tier="gpu")
        # a clock at D = 2: the set-up lasts 2 x setup_s real seconds
        server = Server(client, MODEL, clock=Clock(2.0, sleep=sleep))
        arrivals = client.subscribe((BlockArrived,), model=MODEL)
        try:
            ctx = ScaleOutContext(
                client,
                server,
                manifest,
                system,
                (Destination(1),),
                ControllerHooks(on_local=_on_local),
                copies=(Copy(0, "gpu"),),
                engine=EngineConfig(max_num_seqs=2),
                serve_while_loading=False,
            )
            start = time.time()  # agents stamp `BlockArrived.t` with the wall clock
            await run_scale_out(ctx)
            first = min(e.t for e in [arrivals.get_nowait() for _ in range(arrivals.qsize())])
            return first - start
        finally:
            await server.close()
            await client.close()

    first_block_s = asyncio.run(run())
    if setup_s:
        assert 2 * setup_s in waited
        assert first_block_s >= 2 * setup_s
    else:
        assert 2 * SETUP_S not in waited
        assert first_block_s < 2 * SETUP_S


def test_a_gloo_groups_setup_floor_is_the_systems_setup_only_under_emulation() -> None:
    clock = Clock(80.0)
    nccl = system_config("nccl")
    assert nccl.group_setup_s == NCCL_GROUP_SETUP_S  # the simulator's charge, one constant

    def ctx(paced: bool) -> SimpleNamespace:
        return SimpleNamespace(server=SimpleNamespace(clock=clock), system=nccl, paced_setups=paced)

    assert group_setup_floor_s(ctx(True)) == 80.0 * NCCL_GROUP_SETUP_S  # type: ignore[arg-type]
    assert group_setup_floor_s(ctx(False)) == 0.0  # type: ignore[arg-type]


@pytest.mark.parametrize("paced", [False, True])
def test_the_nccl_baseline_scales_out_through_a_real_gloo_group(
    paced, make_cluster, manifest
) -> None:
    """Unpaced, the group's creation is what it takes (well under a modelled set-up);
    paced (emulation), no block moves before the system's set-up has passed on the
    serving clock, on every member, as the simulator's chain waits it."""
    cluster = make_cluster(3, preload_engine=True)  # no caps: loopback cannot shape gloo's
    waited: list[float] = []
    setup_s = 1.0  # x D = 2: 2 real s, far above a 3-member loopback group's creation

    async def sleep(real_s: float) -> None:
        waited.append(real_s)
        await asyncio.sleep(real_s)

    async def run():
        whole = {0: list(range(manifest.num_blocks))}
        client = await connected(cluster, manifest, whole, tier="gpu")
        server = Server(client, MODEL, clock=Clock(2.0, sleep=sleep))
        arrivals = client.subscribe((BlockArrived,), model=MODEL)
        try:
            ctx = ScaleOutContext(
                client,
                server,
                manifest,
                replace(system_config("nccl"), group_setup_s=setup_s),
                (Destination(1), Destination(2)),
                ControllerHooks(on_local=_on_local),
                copies=(Copy(0, "gpu"),),
                engine=EngineConfig(max_num_seqs=2),
                serve_while_loading=False,
                timeout_s=60,
                paced_setups=paced,
            )
            start = time.time()  # agents stamp `BlockArrived.t` with the wall clock
            await run_scale_out(ctx)
            first = min(e.t for e in [arrivals.get_nowait() for _ in range(arrivals.qsize())])
            return ctx.report.multicast, first - start
        finally:
            await server.close()
            await client.close()

    result, first_block_s = asyncio.run(run())
    assert result is not None and result.complete_s is not None
    g = result.group
    assert g is not None and not g.fell_back and g.errors == ()
    assert g.setup_s is not None and g.setup_s > 0 and g.num_bytes == manifest.total_bytes
    assert 2 * setup_s not in waited  # never a modelled wait on the controller: the group's
    formed = max(s for s in g.member_setup_s if s is not None)
    if paced:
        assert g.setup_s >= 2 * setup_s and first_block_s >= 2 * setup_s
        assert formed < 2 * setup_s  # the members' real forming, reported without the floor
    else:
        assert g.setup_s < 2 * setup_s and first_block_s < 2 * setup_s
