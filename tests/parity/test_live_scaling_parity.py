"""BlitzScale live scaling parity (§4, §5.2): the same live target (the layers it holds),
sources (what is on them, what is queued on them unstarted) and queue (arrival times,
prompt lengths) give the same cooperative batches — whether to help at all (the SLO check),
which requests (§5.2 step (1): the router's queue and the partner's queued ones, oldest
first), which split, which source (§5.2: the overloaded instance the target pairs with),
and whether a zigzag batch waits for its layers — in `surge serve`
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
from surge.runtime.protocol import InstanceQueuedOp, InstanceTakeQueuedOp, QueuedReply
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
    queued_on: dict[int, int] | None = None
    """Source node -> requests routed to it earlier (older than the router's queue) and
    queued on its engine, not started."""
    decode_nodes: tuple[int, ...] = ()
    """Sources that are P/D decode instances (the rest prefill): they do not cooperate
    (`policy.blitzscale.live_scaling.cooperating`, BlitzScale §5.2)."""
    least_loaded: bool = False
    """The counterfactual `SystemConfig.live_least_loaded` (surge before 2026-11-29)."""


SCENARIOS = {
    # BlitzScale §5.2: the partner is the overloaded instance (main before 2026-11-29 ran
    # the batch on the least loaded one, node 1)
    "help: the overloaded source, first batch": Scenario((4,), {0: 3, 1: 1, 2: 1}, 6, 100.0),
    "help: least loaded source (counterfactual)": Scenario(
        (4,), {0: 3, 1: 1, 2: 1}, 6, 100.0, least_loaded=True
    ),
    "decline: the SLO holds without help": Scenario((4,), {0: 0}, 2, 0.0),
    "zigzag: a batch waits for its layers, then runs": Scenario((1, 1, 2), {0: 0}, 16, 100.0),
    "help: a source's queued requests go first": Scenario((4,), {0: 0, 1: 3}, 3, 100.0, {0: 3}),
    # §5.2 step (1): the partner's (node 0's) queue and the router's, not node 1's older
    # queued requests (main before 2026-11-29: node 1, the least loaded, and its queue)
    "help: the partner's queue, not another source's": Scenario(
        (4,), {0: 5, 1: 0}, 4, 100.0, {1: 2}
    ),
    # under P/D the busier source (node 0) decodes: the idler prefill one cooperates
    "help: a prefill source, not the busier decode one": Scenario(
        (4,), {0: 3, 1: 1}, 6, 100.0, decode_nodes=(0,)
    ),
}


def _queued_ids(s: Scenario) -> dict[int, list[int]]:
    """Source node -> ids of the requests queued on it (after the router's queue's)."""
    out, next_id = {}, s.num_waiting
    for node, n in (s.queued_on or {}).items():
        out[node] = list(range(next_id, next_id + n))
        next_id += n
    return out


def _queued_arrival_s(now_s: float, s: Scenario, req_id: int) -> float:
    """Requests queued on a source arrived before the router's queue, one 0.1 s apart."""
    return now_s - s.waited_s - 1.0 + 0.1 * (req_id - s.num_waiting)


class QueueClient(FakeClient):
    """The sources' agents: each answers what it holds queued and gives it back."""

    def __init__(self, queued: dict[int, list[str]]) -> None:
        super().__init__()
        self.queued = queued

    async def call_bytes(self, node: int, op) -> tuple[QueuedReply, memoryview]:
        held = self.queued.setdefault(node, [])
        if isinstance(op, InstanceTakeQueuedOp):
            taken = [r for r in held if r in op.req_ids]
            held[:] = [r for r in held if r not in taken]
            return QueuedReply(tuple(taken)), memoryview(b"")
        assert isinstance(op, InstanceQueuedOp), op
        return QueuedReply(tuple(held)), memoryview(b"")


def _runtime_log(s: Scenario, through_loop: bool = False) -> list[tuple]:
    """The runtime's batches: looks made by hand, one per `s.held`; `through_loop`: its own
    loop (`start`) with a 30-s poll, the receiver going live once the loop waits."""
    log: list[tuple] = []
    queued = _queued_ids(s)
    client = QueueClient({node: [str(i) for i in ids] for node, ids in queued.items()})
    now = time.monotonic()

    def request(req_id: int, arrival_t: float) -> SimpleNamespace:
        return SimpleNamespace(
            req_id=str(req_id),
            arrival_t=arrival_t,
            prompt_token_ids=[1] * PROMPT_TOKENS,
            output_token_ids=[],
            done=asyncio.Event(),
        )

    endpoints = {}
    for node, n in s.outstanding.items():
        ep = LocalEndpoint(client, node, "tiny", f"tiny-node{node}")  # type: ignore[arg-type]
        ep.requests = {f"on{node}-{i}": object() for i in range(n)}  # type: ignore[misc]
        for i in queued.get(node, []):
            ep.requests[str(i)] = request(i, _queued_arrival_s(now, s, i))  # type: ignore[assignment]
        endpoints[ep.name] = ep
    queue = [request(i, now - s.waited_s) for i in range(s.num_waiting)]
    roles = {
        ep.name: "decode" if ep.node in s.decode_nodes else "prefill" for ep in endpoints.values()
    }
    server = SimpleNamespace(
        endpoints=endpoints,
        queue=queue,
        pd=SimpleNamespace(roles=roles, hold=lambda *a, **k: None) if s.decode_nodes else None,
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
        system=replace(SYSTEM, live_least_loaded=s.least_loaded),
        client=client,
        ttft_slo_s=Slo().ttft_s,
        events=NO_BUS,
        report=ScaleOutReport(),
    )

    async def live_prefill(server, manifest, new, old, t, batch, deliver, keep) -> None:
        log.append(("batch", new, old.node, t, tuple(int(r.req_id) for r in batch)))

    held: dict[int, set[int]] = {TARGET: set(range(s.held[0]))}
    live = runtime_live.LiveScaling(ctx, held)  # type: ignore[arg-type]

    async def looks() -> None:
        live.go_live(TARGET)
        for layers in s.held:
            held[TARGET].clear()
            held[TARGET].update(range(layers))
            await live.step()

    async def loop_looks() -> None:
        task = live.start()
        await asyncio.sleep(0.2)  # the loop waits for its first look
        live.go_live(TARGET)
        for _ in range(100):  # 2 s at most, far below the poll
            if log:
                break
            await asyncio.sleep(0.02)
        await live.stop(task)

    patch = pytest.MonkeyPatch()
    with patch.context() as mp:
        mp.setattr(runtime_live, "live_prefill", live_prefill)
        mp.setattr(runtime_live, "LOOK_INTERVAL_S", 30.0)
        asyncio.run(loop_looks() if through_loop else looks())
    return log


def _sim_log(s: Scenario, tmp_path) -> list[tuple]:
    system = replace(SYSTEM, live_least_loaded=s.least_loaded)
    sim = simulation(tmp_path, system, TARGET + 1, "registry", (NUM_LAYERS,))
    pool = entry_pool(sim)
    for node, n in s.outstanding.items():
        source = instance_on(sim, node, serving=True)
        source.reserved = n  # on their way to it
        if s.decode_nodes:
            source.role = "decode" if node in s.decode_nodes else "prefill"
        # A full engine starts nothing new while the test looks (the runtime's stand-in
        # queue does not drain either): requests routed to it stay waiting.
        source.max_batch = 0
    target = instance_on(sim, TARGET, serving=False)
    now = sim.world.loop.now_s
    for node, ids in _queued_ids(s).items():
        source = next(i for i in pool.instances if i.machine == node)
        for i in ids:  # queued on it (a full engine: none starts)
            source.submit(SimRequest(i, 0, _queued_arrival_s(now, s, i), PROMPT_TOKENS, 4), False)
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
    queued = _queued_ids(s)
    if name.startswith("decline"):
        assert runtime == []
    elif queued:
        # §5.2 step (1): the partner's queued requests (the oldest) first, then the
        # router's; another source's queue stays there
        partner = runtime[0][2]
        oldest = queued.get(partner, []) + list(range(s.num_waiting))
        assert runtime[0][4] == tuple(oldest[: SYSTEM.live_batch])
        load = {n: k + len(queued.get(n, [])) for n, k in s.outstanding.items()}
        assert partner == max(load, key=lambda n: (load[n], -n))
    else:
        prefill = {n: k for n, k in s.outstanding.items() if n not in s.decode_nodes}
        pick = min if s.least_loaded else max  # the counterfactual, else §5.2's overloaded
        assert runtime[0][2] == pick(prefill, key=lambda n: (prefill[n], -n if pick is max else n))
        assert runtime[0][4] == tuple(range(SYSTEM.live_batch))
    if name.startswith("zigzag"):
        # the second look waited: only two batches, the second on two layers
        assert [b[3] for b in runtime] == [1, 2]


def test_a_receiver_going_live_is_looked_at_at_once(tmp_path) -> None:
    """The simulator's `go_live` looks at once; the runtime's loop waited for its next poll
    (50 ms of the serving clock: the emulated §6.1 run's first live batch started at 1.104
    s, the simulator's at 1.067). Now `go_live` wakes it, so with a 30-s poll the first
    batch still comes at once, the simulator's."""
    s = SCENARIOS["help: the overloaded source, first batch"]
    runtime = _runtime_log(s, through_loop=True)
    assert runtime and runtime == _sim_log(s, tmp_path)


REDISTRIBUTE_QUEUED = {0: (5.0, 3.0, 1.0), 1: (4.0, 2.0)}
"""Source node -> how long ago each request queued on it (not started) arrived, when the
target becomes whole; ids count up in this order (node 0's 0-2, node 1's 3-4)."""


def _redistribute_ids() -> dict[int, list[tuple[int, float]]]:
    out, next_id = {}, 0
    for node, ages in REDISTRIBUTE_QUEUED.items():
        out[node] = [(next_id + k, age) for k, age in enumerate(ages)]
        next_id += len(ages)
    return out


def _runtime_redistributed(pd: bool) -> list[int]:
    queued = _redistribute_ids()
    client = QueueClient({n: [str(i) for i, _ in reqs] for n, reqs in queued.items()})
    now = time.monotonic()
    endpoints = {}
    for node, reqs in queued.items():
        ep = LocalEndpoint(client, node, "tiny", f"tiny-node{node}")  # type: ignore[arg-type]
        ep.requests = {  # type: ignore[assignment]
            "started": SimpleNamespace(req_id="started"),  # under way: it stays
            **{
                str(i): SimpleNamespace(
                    req_id=str(i),
                    arrival_t=now - age,
                    prompt_token_ids=[1] * PROMPT_TOKENS,
                    output_token_ids=[],
                )
                for i, age in reqs
            },
        }
        endpoints[ep.name] = ep
    routed: list[int] = []

    async def requeue(reqs) -> None:
        routed.extend(int(r.req_id) for r in reqs)

    server = SimpleNamespace(endpoints=endpoints, pd=object() if pd else None, requeue=requeue)
    ctx = SimpleNamespace(server=server, report=ScaleOutReport(), client=client)
    live = runtime_live.LiveScaling(ctx, {TARGET: set(range(NUM_LAYERS))})  # type: ignore[arg-type]
    live.go_live(TARGET)
    live.go_local(TARGET)
    asyncio.run(live.redistribute(TARGET))
    assert ctx.report.live_redistributed == len(routed)
    assert all(client.queued[n] == [] for n in queued) or not routed
    return routed


def _sim_redistributed(pd: bool, tmp_path) -> list[int]:
    system = replace(SYSTEM, pd_disaggregation=pd)
    sim = simulation(tmp_path, system, TARGET + 1, "registry", (NUM_LAYERS,))
    pool = entry_pool(sim)
    now = sim.world.loop.now_s = 100.0
    for node, reqs in _redistribute_ids().items():
        source = instance_on(sim, node, serving=True)
        source.max_batch = 0  # starts nothing while the test looks (as the runtime's stand-in)
        for i, age in reqs:
            source.submit(SimRequest(i, 0, now - age, PROMPT_TOKENS, 4), start=False)
    target = instance_on(sim, TARGET, serving=True)
    live = sim.loader.live
    live.was_live.add(target.id)  # it went live while loading
    routed: list[int] = []
    live.requests.requeue = lambda pool, reqs: routed.extend(r.id for r in reqs)  # type: ignore[method-assign]
    live.redistribute(pool, target)
    return routed


@pytest.mark.parametrize("pd", [False, True], ids=["no P/D", "P/D"])
def test_a_whole_target_sends_the_same_queued_requests_back_to_the_router(pd, tmp_path) -> None:
    """§5.2 step 3 (`redistributed`): once the live target holds every layer and serves,
    every request queued on the instances it helped that has not started goes back to
    the router, oldest first, in both bodies; one under way stays. Before, the runtime
    moved an even share of every request (started ones re-prefilled) and, under P/D,
    none: the emulated §6.1 run's remedy instance then idled and was mutated to decode
    while 18 requests queued on the old prefill instance."""
    runtime = _runtime_redistributed(pd)
    assert runtime == _sim_redistributed(pd, tmp_path)
    assert runtime == [0, 3, 1, 4, 2]
