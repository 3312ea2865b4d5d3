"""BlitzScale live scaling parity (§4, §5.2): the same live target (the layers it holds),
sources (what is on them) and queue (arrival times, prompt lengths) give the same
cooperative batches — whether to help at all (the SLO check), which requests, which split,
which source, and whether a zigzag batch waits for its layers — in `surge serve`
(`runtime/scaleout/live.LiveScaling.step`) and in the simulator
(`sim/live_scaling.LiveScaling`): both carry out `LiveScalingState.look`.

What each body did is recorded at its effect: the runtime's `live_prefill` call (stood in
for: no agents), the simulator's `LiveRecord`; in node/machine terms and request position
in the queue. Neither body has measured Time_l yet (no block has landed), so both solve on
the system's fallback; the scenarios are chosen so that the SLO check's verdict does not
hang on the bodies' different prefill measurements (the runtime's spans, the simulator's
cost model)."""

import asyncio
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from surge.events import NO_BUS
from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.runtime.clock import REAL_CLOCK
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.scaleout import ScaleOutReport
from surge.runtime.scaleout import live as runtime_live
from surge.sim.request import SimRequest
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import entry_pool, instance_on, simulation

NUM_LAYERS = 8  # the parity model: 8 layers, one per block
TARGET = 3
SYSTEM = replace(system_config("blitzscale"), pd_disaggregation=False, num_blocks=NUM_LAYERS)
PROMPT_TOKENS = 16


@dataclass(frozen=True)
class Scenario:
    held: tuple[int, ...]
    """Layers the target holds at each look."""
    outstanding: dict[int, int]
    """Source node -> requests on it."""
    num_waiting: int
    waited_s: float
    """How long the queued requests have waited (past the TTFT SLO, or not at all)."""


SCENARIOS = {
    "help: least loaded source, first batch": Scenario((4,), {0: 3, 1: 1, 2: 1}, 6, 100.0),
    "decline: the SLO holds without help": Scenario((4,), {0: 0}, 2, 0.0),
    "zigzag: a batch waits for its layers, then runs": Scenario((1, 1, 2), {0: 0}, 16, 100.0),
}


def _runtime_log(s: Scenario) -> list[tuple]:
    log: list[tuple] = []
    client = FakeClient()
    endpoints = {}
    for node, n in s.outstanding.items():
        ep = LocalEndpoint(client, node, "tiny", f"tiny-node{node}")  # type: ignore[arg-type]
        ep.requests = {f"on{node}-{i}": object() for i in range(n)}  # type: ignore[misc]
        endpoints[ep.name] = ep
    now = time.monotonic()
    queue = [
        SimpleNamespace(
            req_id=i,
            arrival_t=now - s.waited_s,
            prompt_token_ids=[1] * PROMPT_TOKENS,
            output_token_ids=[],
            done=asyncio.Event(),
        )
        for i in range(s.num_waiting)
    ]
    server = SimpleNamespace(
        endpoints=endpoints,
        queue=queue,
        pd=None,
        prefill_spans=[],
        departures=[],
        clock=REAL_CLOCK,
    )
    server.take = lambda reqs: queue.__setitem__(slice(None), [r for r in queue if r not in reqs])
    blocks = [SimpleNamespace(first_layer=b, end_layer=b + 1) for b in range(NUM_LAYERS)]
    manifest = SimpleNamespace(arch=SimpleNamespace(num_layers=NUM_LAYERS), blocks=blocks)
    ctx = SimpleNamespace(
        model="tiny",
        server=server,
        manifest=manifest,
        system=SYSTEM,
        client=client,
        ttft_slo_s=Slo().ttft_s,
        events=NO_BUS,
        report=ScaleOutReport(),
    )

    async def live_prefill(server, manifest, new, old, t, batch, deliver, keep) -> None:
        log.append(("batch", new, old.node, t, tuple(r.req_id for r in batch)))

    held: dict[int, set[int]] = {TARGET: set()}
    live = runtime_live.LiveScaling(ctx, held)  # type: ignore[arg-type]
    live.go_live(TARGET)

    async def looks() -> None:
        for layers in s.held:
            held[TARGET].clear()
            held[TARGET].update(range(layers))
            await live.step()

    patch = pytest.MonkeyPatch()
    with patch.context() as mp:
        mp.setattr(runtime_live, "live_prefill", live_prefill)
        asyncio.run(looks())
    return log


def _sim_log(s: Scenario, tmp_path) -> list[tuple]:
    sim = simulation(tmp_path, SYSTEM, TARGET + 1, "registry", (NUM_LAYERS,))
    pool = entry_pool(sim)
    for node, n in s.outstanding.items():
        source = instance_on(sim, node, serving=True)
        source.reserved = n  # on their way to it
        # A full engine starts nothing new while the test looks (the runtime's stand-in
        # queue does not drain either): requests routed to it stay waiting.
        source.max_batch = 0
    target = instance_on(sim, TARGET, serving=False)
    now = sim.world.loop.now_s
    pool.queue.extend(
        SimRequest(i, 0, now - s.waited_s, PROMPT_TOKENS, 4) for i in range(s.num_waiting)
    )
    held = [s.held[0]]
    live = sim.loader.live
    live.go_live(pool, target, lambda: held[0], lambda: None)  # the first look
    for layers in s.held[1:]:
        # the next look: after the batch in flight, else after the poll
        held[0] = layers
        busy = live.targets[target.id].busy
        sim.world.loop.run(until_s=sim.world.loop.now_s + (1.0 if busy else 0.011))
    machine = {i.id: i.machine for i in pool.instances} | {target.id: TARGET}
    return [
        ("batch", machine[r.target], machine[r.source], r.split[0], r.request_ids)
        for r in sim.world.result.live_batches
    ]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_view_gives_the_same_cooperative_batches(name: str, tmp_path) -> None:
    s = SCENARIOS[name]
    runtime = _runtime_log(s)
    assert runtime == _sim_log(s, tmp_path)
    if name.startswith("decline"):
        assert runtime == []
    else:
        assert runtime[0][2] == min(s.outstanding, key=lambda n: (s.outstanding[n], n))
        assert runtime[0][4] == tuple(range(SYSTEM.live_batch))
    if name.startswith("zigzag"):
        # the second look waited: only two batches, the second on two layers
        assert [b[3] for b in runtime] == [1, 2]
