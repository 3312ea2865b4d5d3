"""Warm-start pipelines parity (λScale §5 warm start, FaaScale §5): the same new instances,
some of them on machines holding the model in host memory, form the same warm groups —
the same members in the same plan order, each loading its blocks in the same order — and
load the rest of the destinations the same way, in `surge serve`
(`runtime/scaleout/run.run_scale_out` → `warm.run_warm_group`) and in the simulator
(`sim/loading.Loader` → `warm_load.start_warm_group`): both carry out
`policy.warm_pipelines.plan_warm_groups` on the start-up plan's warm-local loads. What a
warm group then does as its blocks land is `policy.loading`'s, whose parity
`test_loading_parity.py` proves.

What each body did is recorded at its effects (a warm group started, a destination
loaded alone, a multicast started), in machine terms; the loads themselves are stubbed.
Node i of the runtime is machine i of the simulator."""

import asyncio
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from surge.control.pool import ParameterPool
from surge.control.scaleouts import startup_request
from surge.policy.systems import system_config
from surge.runtime.scaleout import run as runtime_run
from surge.runtime.scaleout.context import ControllerHooks, ScaleOutContext
from surge.sim import loading as sim_loading
from surge.sim.multicast_load import MulticastLoads
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import add_host_copy, entry_pool, instance_on, simulation

NUM_BLOCKS = 4
NUM_MACHINES = 7
SYSTEM = replace(system_config("lambdascale"), num_blocks=NUM_BLOCKS)


@dataclass(frozen=True)
class Case:
    host: tuple[int, ...]
    """Machines holding the model in host memory."""
    new: tuple[int, ...]
    """Machines of the new instances."""
    gpu: tuple[int, ...] = ()
    """Machines serving an instance (a GPU copy)."""


CASES = {
    # three warm destinations: one group of three, each its own segment first
    "one-group": Case(host=(1, 2, 3), new=(1, 2, 3)),
    # six warm destinations over four blocks: two groups of three
    "two-groups": Case(host=(1, 2, 3, 4, 5, 6), new=(1, 2, 3, 4, 5, 6)),
    # one warm destination: no group, it loads alone; the other receives a multicast
    "alone": Case(host=(2,), new=(2, 3), gpu=(0,)),
    # two warm destinations and one without a copy: a group of two and a multicast
    "group-and-multicast": Case(host=(1, 2), new=(1, 2, 3), gpu=(0,)),
}


def _runtime(case: Case) -> list:
    log: list = []
    manifest = SimpleNamespace(num_blocks=NUM_BLOCKS, total_bytes=4 * NUM_BLOCKS)
    pool = ParameterPool()  # what the controller knows: who holds which copy
    pool.add_model("m", NUM_BLOCKS)
    for n in case.gpu:
        pool.add("m", n, "gpu", list(range(NUM_BLOCKS)))
    for n in case.host:
        pool.add("m", n, "host", list(range(NUM_BLOCKS)))
    live = set(range(NUM_MACHINES))
    question = startup_request(SYSTEM, pool, "m", list(case.new), {}, live)

    async def warm_group(ctx, group) -> None:
        log.append(("warm", group.nodes, group.load_orders))

    async def alone(ctx, node, source) -> None:
        log.append(("alone", node))

    async def multicast(ctx, plan) -> None:
        log.append(("multicast", tuple(sorted(plan.receivers))))

    ctx = ScaleOutContext(
        client=FakeClient(),  # type: ignore[arg-type]
        server=SimpleNamespace(),  # type: ignore[arg-type]
        manifest=manifest,  # type: ignore[arg-type]
        system=SYSTEM,
        destinations=question.destinations,
        hooks=ControllerHooks(on_local=alone),  # type: ignore[arg-type]
        copies=question.copies,
    )

    with pytest.MonkeyPatch().context() as mp:
        mp.setattr(runtime_run, "run_warm_group", warm_group)
        mp.setattr(runtime_run, "load_then_serve", alone)
        mp.setattr(runtime_run, "_multicast", multicast)
        asyncio.run(runtime_run.run_scale_out(ctx))
    return sorted(log)


def _sim(case: Case, tmp_path) -> list:
    log: list = []
    sim = simulation(tmp_path, SYSTEM, NUM_MACHINES, "registry", seed_host_copies=True)
    for m in case.host:
        add_host_copy(sim, m)
    for m in case.gpu:
        instance_on(sim, m, serving=True)
    pool = entry_pool(sim)
    new = [instance_on(sim, m, serving=False) for m in case.new]
    pool.instances.extend(new)
    machine = {i.id: i.machine for i in new}

    def warm_group(actions, host, cache, pool, group, members, num_blocks) -> None:
        log.append(("warm", tuple(machine[n] for n in group.nodes), group.load_orders))

    def alone(self, pool, inst, source) -> None:
        log.append(("alone", inst.machine))

    def multicast(self, pool, plan, by_id) -> None:
        log.append(("multicast", tuple(sorted(machine[v] for v in plan.receivers))))

    with pytest.MonkeyPatch().context() as mp:
        mp.setattr(sim_loading, "start_warm_group", warm_group)
        mp.setattr(sim_loading.Loader, "load_local", alone)
        mp.setattr(MulticastLoads, "start", multicast)
        sim.loader.load(pool, new)
    return sorted(log)


@pytest.mark.parametrize("name", list(CASES))
def test_both_bodies_form_the_same_warm_groups(name: str, tmp_path) -> None:
    case = CASES[name]
    assert _runtime(case) == _sim(case, tmp_path)


def test_the_cases_exercise_the_groups(tmp_path) -> None:
    """Not vacuous: one group, two groups, none, and a group beside a multicast."""
    logs = {}
    for n, c in CASES.items():
        (tmp_path / n).mkdir()
        logs[n] = _sim(c, tmp_path / n)
    kinds = {n: [e[0] for e in log] for n, log in logs.items()}
    assert kinds["one-group"] == ["warm"]
    assert logs["one-group"][0][2][1][0] == 1  # node 1 starts with its own segment
    assert kinds["two-groups"] == ["warm", "warm"]
    assert kinds["alone"] == ["alone", "multicast"]
    assert kinds["group-and-multicast"] == ["multicast", "warm"]
