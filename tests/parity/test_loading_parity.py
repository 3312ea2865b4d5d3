"""Serve-while-loading parity: a 1 -> 4 λScale scale-out of a 4-block model, with the same
blocks arriving in the same order, opens the same execution pipelines and retires them (mode
switch, spreading its requests over the same members) and brings the same nodes up
alone, in the same order, in `surge serve`
(`runtime/scaleout/multicast.py`) and in the simulator (`sim/multicast_load.py`).

Each body plans its multicast (which must come out the same) and carries the plan's
transfers through a stand-in for its transport: the same seeded shuffle within each plan
step gives both the same arrival order. What each body then *did* is recorded at its
effects (endpoints added and retired, nodes serving alone), in machine terms."""

import asyncio
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from surge.policy.multicast.plan import Plan
from surge.policy.startup import Copy, Destination, StartupRequest, plan_startup
from surge.policy.systems import system_config
from surge.runtime.clock import REAL_CLOCK
from surge.runtime.protocol import BlockArrived
from surge.runtime.scaleout import multicast as runtime_multicast
from surge.runtime.scaleout.context import ControllerHooks, ScaleOutContext
from surge.sim import multicast_load as sim_multicast
from surge.sim.loading_actions import LoadingActions
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import entry_pool, instance_on, simulation

NUM_BLOCKS = 4
NUM_MACHINES = 5  # machine 0 serves; 1..4 are new
SYSTEM = replace(system_config("lambdascale"), num_blocks=NUM_BLOCKS, max_sources=1)


def arrival_order(plan: Plan, seed: int) -> list[tuple[int, int]]:
    """(plan node, block) of every transfer, step by step, shuffled within a step."""
    rng = random.Random(seed)
    out: list[tuple[int, int]] = []
    for step in plan.steps:
        transfers = [(tr.dst, tr.block) for tr in step]
        rng.shuffle(transfers)
        out += transfers
    return out


def _runtime_log(seed: int) -> tuple[list, Plan]:
    log: list = []
    seen: dict[str, Plan] = {}

    class Executor:
        def __init__(self, client, model, plan, agents, **_kw) -> None:
            self.client, self.model, self.plan, self.agents = client, model, plan, agents
            self.mc_id = "mc"
            seen["plan"] = plan

        async def run(self) -> object:
            for v, block in arrival_order(self.plan, seed):
                ev = BlockArrived(node=self.agents[v], t=0.0, model=self.model, block=block,
                                  tier="gpu", mc_id=self.mc_id)  # fmt: skip
                for q in self.client.queues:
                    q.put_nowait(ev)
                await asyncio.sleep(0)
            return SimpleNamespace()

    class Pipeline:
        def __init__(self, client, manifest, model, name, stages, engine) -> None:
            self.name, self.nodes = name, tuple(agent for agent, _, _ in stages)

        async def open(self) -> None:
            pass

    class Client(FakeClient):
        def __init__(self) -> None:
            super().__init__()
            self.queues: list[asyncio.Queue] = []

        def subscribe(self, event_types, model=None) -> asyncio.Queue:
            q: asyncio.Queue = asyncio.Queue()
            self.queues.append(q)
            return q

    class Server:
        model = "m"
        clock = REAL_CLOCK

        def __init__(self) -> None:
            self.endpoints: dict[str, Pipeline] = {}

        async def add_endpoint(self, ep: Pipeline) -> None:
            self.endpoints[ep.name] = ep
            log.append(("open", tuple(sorted(ep.nodes))))

        async def retire(self, name: str, spread_over: tuple[str, ...] = ()) -> list:
            log.append(("retire", tuple(sorted(self.endpoints.pop(name).nodes))))
            # λScale §4.4: the members whose local instances take its requests
            log.append(("spread", tuple(int(n.rsplit("node", 1)[1]) for n in spread_over)))
            return []

    async def open_local(ctx, node: int) -> None:
        log.append(("local", node))

    manifest = SimpleNamespace(
        num_blocks=NUM_BLOCKS,
        total_bytes=4 * NUM_BLOCKS,
        blocks=[SimpleNamespace(first_layer=2 * b, end_layer=2 * b + 2) for b in range(4)],
    )
    dests = tuple(Destination(n, machine=n) for n in range(1, NUM_MACHINES))
    ctx = ScaleOutContext(
        client=Client(),  # type: ignore[arg-type]
        server=Server(),  # type: ignore[arg-type]
        manifest=manifest,  # type: ignore[arg-type]
        system=SYSTEM,
        destinations=dests,
        hooks=ControllerHooks(on_local=open_local),  # type: ignore[arg-type]
        copies=(Copy(0, "gpu", machine=0),),
    )
    plan = plan_startup(StartupRequest(SYSTEM, ctx.destinations, ctx.copies))
    patch = pytest.MonkeyPatch()
    with patch.context() as mp:
        mp.setattr(runtime_multicast, "MulticastExecutor", Executor)
        mp.setattr(runtime_multicast, "PipelineEndpoint", Pipeline)
        mp.setattr(runtime_multicast, "open_local", open_local)
        asyncio.run(runtime_multicast.run_multicast(ctx, plan))
    return log, seen["plan"]


def _sim_log(seed: int, tmp_path) -> tuple[list, Plan]:
    log: list = []
    seen: dict[str, Plan] = {}
    sim = simulation(tmp_path, SYSTEM, NUM_MACHINES, "registry")
    pool = entry_pool(sim)
    source = instance_on(sim, 0, serving=True)
    new = [instance_on(sim, m, serving=False) for m in range(1, NUM_MACHINES)]
    pool.instances.extend(new)
    machine = {i.id: i.machine for i in [source, *new]}

    def machines_of(ep) -> tuple[int, ...]:
        gpus = {g for w in ep.placement.workers for g in w}
        return tuple(sorted(machine[i.id] for i in new if i.gpus[0] in gpus))

    spread_retired = sim.loader.actions.mode_switch.spread_retired

    def spread(pool, reqs, members) -> None:
        log.append(("spread", tuple(m.machine for m in members)))
        spread_retired(pool, reqs, members)

    sim.loader.actions.mode_switch.spread_retired = spread  # type: ignore[method-assign]

    class Recording(list):
        def append(self, ep) -> None:
            log.append(("open", machines_of(ep)))
            super().append(ep)

        def remove(self, ep) -> None:
            log.append(("retire", machines_of(ep)))
            super().remove(ep)

    pool.pipelines = Recording()

    class Run:
        def __init__(self, net, plan, path, block_bytes, on_arrival, on_finished, on_transfers):
            self.plan, self.on_arrival, self.on_finished = plan, on_arrival, on_finished
            seen["plan"] = plan

        def start(self) -> None:
            for v, block in arrival_order(self.plan, seed):
                self.on_arrival(v, block)
            self.on_finished()

    def fan_out(self, pool, inst) -> None:
        log.append(("local", inst.machine))

    patch = pytest.MonkeyPatch()
    with patch.context() as mp:
        mp.setattr(sim_multicast, "MulticastRun", Run)
        mp.setattr(LoadingActions, "_go_local", fan_out)
        sim.loader.load(pool, new)
    return log, seen["plan"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_arrivals_open_and_retire_the_same_pipelines(seed: int, tmp_path) -> None:
    runtime, runtime_plan = _runtime_log(seed)
    sim, sim_plan = _sim_log(seed, tmp_path)
    assert runtime_plan.steps == sim_plan.steps  # the same multicast in both
    assert runtime == sim
    kinds = [k for k, _ in runtime]
    assert "open" in kinds and "retire" in kinds  # pipelines served, then mode-switched
    for i, (kind, nodes) in enumerate(runtime):  # spread over all of the pipeline's members
        if kind == "retire":
            assert runtime[i + 1][0] == "spread" and tuple(sorted(runtime[i + 1][1])) == nodes
    assert sorted(n for k, n in runtime if k == "local") == [1, 2, 3, 4]
