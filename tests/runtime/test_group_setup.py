"""The NCCL baseline's group creation in `surge serve` (λScale §7.2, BlitzScale §5): with the
`blocks` transport a scale-out by a system with a set-up cost (`SystemConfig.group_setup_s`)
waits that long on the serving clock before its multicast plans and moves its first block,
as the simulator's loader does (`sim/loading.py`), and a system without one starts at once;
the `nccl` system itself (`gloo` transport) waits nothing modelled: it creates a real gloo
group, whose measured creation is its set-up, and moves the model through it."""

import asyncio
import time
from dataclasses import replace

import pytest

from surge.config import EngineConfig
from surge.policy.startup import Copy, Destination
from surge.policy.systems import system_config
from surge.runtime.clock import Clock
from surge.runtime.protocol import BlockArrived
from surge.runtime.scaleout import ControllerHooks, ScaleOutContext, run_scale_out
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


def test_the_nccl_baseline_scales_out_through_a_real_gloo_group(make_cluster, manifest) -> None:
    cluster = make_cluster(3, preload_engine=True)  # no caps: loopback cannot shape gloo's
    waited: list[float] = []

    async def sleep(real_s: float) -> None:
        waited.append(real_s)
        await asyncio.sleep(real_s)

    async def run():
        whole = {0: list(range(manifest.num_blocks))}
        client = await connected(cluster, manifest, whole, tier="gpu")
        server = Server(client, MODEL, clock=Clock(2.0, sleep=sleep))
        try:
            ctx = ScaleOutContext(
                client,
                server,
                manifest,
                system_config("nccl"),
                (Destination(1), Destination(2)),
                ControllerHooks(on_local=_on_local),
                copies=(Copy(0, "gpu"),),
                engine=EngineConfig(max_num_seqs=2),
                serve_while_loading=False,
                timeout_s=60,
            )
            await run_scale_out(ctx)
            return ctx.report.multicast
        finally:
            await server.close()
            await client.close()

    result = asyncio.run(run())
    assert result is not None and result.complete_s is not None
    g = result.group
    assert g is not None and not g.fell_back and g.errors == ()
    assert g.setup_s is not None and g.setup_s > 0 and g.num_bytes == manifest.total_bytes
    assert 2 * system_config("nccl").group_setup_s not in waited  # measured, not modelled
