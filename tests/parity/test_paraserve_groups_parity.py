"""ParaServe groups parity (`group_sizing` fixed, ParaServe §4.1, §8 Fig. 8's 4 workers): the
same free machines and the same groups wanted form the same groups — the same members in
stage order, each with the same blocks — in `surge serve`
(`runtime/scaleout/paraserve.plan_groups`) and in the simulator (`sim/groups.Groups.start`),
including when fewer machines are free than a group wants (both take fewer workers: Alg. 1's
own fallback is the smallest group, §4.1.1) and when a scale-out wants more groups than
the machines allow (both stop at the first group that cannot form).

Machines have one GPU each, so a machine is a node in both; the runtime's destinations are
the machines the simulator's placement takes first (the lowest free ones)."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from surge.policy.startup import Destination
from surge.policy.systems import system_config
from surge.runtime.clock import REAL_CLOCK
from surge.runtime.scaleout.context import ControllerHooks, ScaleOutContext
from surge.runtime.scaleout.paraserve import plan_groups
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import entry_pool, simulation

SYSTEM = replace(system_config("paraserve"), group_sizing="fixed", pipeline_size=4)

CASES = {
    # (machines, machines busy, groups wanted)
    "whole": (6, (), 1),
    "fewer-free": (4, (0, 2), 1),
    "two-groups": (6, (), 2),
    "out-of-machines": (5, (1,), 3),
}


def _sim(machines: int, busy: tuple[int, ...], wanted: int, tmp_path) -> tuple[list, tuple]:
    sim = simulation(tmp_path, SYSTEM, machines, "registry")
    for m in busy:
        sim.gpus.take((sim.world.state.machines[m].first_gpu,))
    pool = entry_pool(sim)
    started = sim.groups.start(pool, wanted)
    machine_of = sim.world.state.machine_of_gpu
    groups = [
        tuple(machine_of[w[0]].index for w in inst.placement.workers)
        for inst in pool.instances[:started]
    ]
    total = sim.world.models[0].profile.total_bytes
    b = SYSTEM.num_blocks
    blocks = tuple(total // b + (1 if i < total % b else 0) for i in range(b))
    return groups, blocks


def _runtime(machines: int, busy: tuple[int, ...], wanted: int, blocks: tuple) -> list:
    free = [m for m in range(machines) if m not in busy]
    manifest = SimpleNamespace(
        num_blocks=len(blocks),
        total_bytes=sum(blocks),
        blocks=[SimpleNamespace(size_bytes=n) for n in blocks],
    )
    ctx = ScaleOutContext(
        client=FakeClient(),  # type: ignore[arg-type]
        server=SimpleNamespace(clock=REAL_CLOCK, queue=[], model="tiny"),  # type: ignore[arg-type]
        manifest=manifest,  # type: ignore[arg-type]
        system=SYSTEM,
        destinations=tuple(Destination(n) for n in free[:wanted]),
        hooks=ControllerHooks(on_local=None),  # type: ignore[arg-type]
        spares=tuple(Destination(n) for n in free[wanted:]),
    )
    groups = plan_groups(ctx)
    return [g.members for g in groups], [g.parts for g in groups]


@pytest.mark.parametrize("name", list(CASES))
def test_both_bodies_form_the_same_groups(name: str, tmp_path) -> None:
    machines, busy, wanted = CASES[name]
    sim_groups, blocks = _sim(machines, busy, wanted, tmp_path)
    runtime_groups, runtime_parts = _runtime(machines, busy, wanted, blocks)
    assert runtime_groups == sim_groups
    # the same blocks per member: the runtime's parts are what the simulator fetches
    for members, parts in zip(runtime_groups, runtime_parts, strict=True):
        assert len(parts) == len(members)


def test_the_cases_exercise_the_rules(tmp_path) -> None:
    """Not vacuous: a whole group, a smaller one, two groups, and a scale-out cut short."""
    seen = {}
    for name, (machines, busy, wanted) in CASES.items():
        (tmp_path / name).mkdir()
        seen[name], _ = _sim(machines, busy, wanted, tmp_path / name)
    assert seen["whole"] == [(0, 1, 2, 3)]
    assert seen["fewer-free"] == [(1, 3)]
    assert seen["two-groups"] == [(0, 1, 2, 3), (4, 5)]
    assert seen["out-of-machines"] == [(0, 2, 3, 4)]
