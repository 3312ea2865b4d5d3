"""λScale §4.3 Case 3 parity: a 1 -> 5 λScale scale-out onto three machines of two GPUs
each (the source's machine-mate, then two machines of two) gets the same multicast plan in
`surge serve` (`runtime/scaleout/multicast.plan_multicast`, host groups from the agents'
reported `NodeLinks.host`) and in the simulator (`sim/multicast_load.py`, GPUs of one
machine), both through `policy.multicast.scale_out.plan_scale_out`: one network receiver
per machine, its mate fed over the machine's fast link, the source's mate off the source.

Runtime node n sits on host n // 2; simulated instance n on machine n // 2, GPU n % 2."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from surge.policy.multicast.plan import Plan
from surge.policy.multicast.topology import NodeLinks
from surge.policy.startup import Copy, Destination, StartupRequest, plan_startup
from surge.policy.systems import system_config
from surge.runtime.scaleout import multicast as runtime_multicast
from surge.runtime.scaleout.context import ControllerHooks, ScaleOutContext
from surge.sim import multicast_load as sim_multicast
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import entry_pool, instance_on, simulation

NUM_BLOCKS = 4
NUM_MACHINES = 3
GPUS = 2
SYSTEM = replace(system_config("lambdascale"), num_blocks=NUM_BLOCKS, max_sources=1)


def _runtime_plan() -> tuple[Plan, list[int]]:
    manifest = SimpleNamespace(num_blocks=NUM_BLOCKS, total_bytes=4 * NUM_BLOCKS)
    nodes = range(NUM_MACHINES * GPUS)
    ctx = ScaleOutContext(
        client=FakeClient(),  # type: ignore[arg-type]
        server=SimpleNamespace(),  # type: ignore[arg-type]
        manifest=manifest,  # type: ignore[arg-type]
        system=SYSTEM,
        destinations=tuple(Destination(n, machine=n // GPUS) for n in nodes if n > 0),
        hooks=ControllerHooks(on_local=None),  # type: ignore[arg-type]
        copies=(Copy(0, "gpu", machine=0),),
        links={n: NodeLinks(host=f"h{n // GPUS}") for n in nodes},
    )
    plan = plan_startup(StartupRequest(SYSTEM, ctx.destinations, ctx.copies))
    agents = list(plan.multicast_nodes)
    outcome = runtime_multicast.plan_multicast(ctx, agents, len(plan.sources))
    return outcome.plan, [a // GPUS for a in agents]


def _sim_plan(tmp_path) -> tuple[Plan, list[int]]:
    sim = simulation(tmp_path, SYSTEM, NUM_MACHINES, "registry", gpus_per_node=GPUS)
    pool = entry_pool(sim)
    instance_on(sim, 0, serving=True)
    new = [
        instance_on(sim, n // GPUS, serving=False, gpu_index=n % GPUS)
        for n in range(1, NUM_MACHINES * GPUS)
    ]
    pool.instances.extend(new)
    seen: dict[str, object] = {}
    real_start = sim_multicast.MulticastLoads.start

    def start(self, pool, plan, by_id) -> None:
        seen["machines"] = [self._instance(v).machine for v in plan.multicast_nodes]
        real_start(self, pool, plan, by_id)

    class Run:
        def __init__(self, net, plan, *args, **kwargs) -> None:
            seen["plan"] = plan

        def start(self) -> None:
            pass

    patch = pytest.MonkeyPatch()
    with patch.context() as mp:
        mp.setattr(sim_multicast.MulticastLoads, "start", start)
        mp.setattr(sim_multicast, "MulticastRun", Run)
        sim.loader.load(pool, new)
    return seen["plan"], seen["machines"]  # type: ignore[return-value]


def _network_receivers(plan: Plan, machine: list[int]) -> dict[int, set[int]]:
    """machine -> the plan nodes on it that receive a block from another machine."""
    out: dict[int, set[int]] = {}
    for step in plan.steps:
        for tr in step:
            if machine[tr.src] != machine[tr.dst]:
                out.setdefault(machine[tr.dst], set()).add(tr.dst)
    return out


def test_both_bodies_replicate_inside_each_machine_alike(tmp_path) -> None:
    runtime, runtime_machines = _runtime_plan()
    sim, sim_machines = _sim_plan(tmp_path)
    assert runtime_machines == sim_machines  # plan node i on the same machine in both
    assert runtime.steps == sim.steps
    # λScale §4.3 Case 3: one network receiver on each receiving machine; the source's
    # machine-mate gets everything from the source over the fast link.
    receivers = _network_receivers(runtime, runtime_machines)
    assert set(receivers) == {1, 2}
    assert all(len(nodes) == 1 for nodes in receivers.values()), receivers
    machine = runtime_machines
    inside = sum(1 for st in runtime.steps for tr in st if machine[tr.src] == machine[tr.dst])
    assert inside == NUM_BLOCKS * 3  # source's mate, and one mate on each other machine
