"""ParaServe node prefetcher parity (§5 Fig. 6(b)): a pipeline group starting with the same
arrivals in the §6.1 window, the same queue and the same warm members has the same members
fetch the rest of the model into host memory after their part, in `surge serve`
(`runtime/scaleout/paraserve.prefetch_plans`) and in the simulator
(`sim/groups.Groups.prefetch_rests`): both call `policy.paraserve.prefetch.plan_prefetch`
with the predictor's keep as the group starts (`group_consolidation` / `Consolidation.keep`)."""

import asyncio
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from surge.policy.paraserve.group_plan import split_blocks
from surge.policy.systems import SystemConfig
from surge.runtime.scaleout.paraserve import prefetch_plans
from surge.runtime.server import Server
from surge.sim.request import SimRequest
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import add_host_copy, entry_pool, simulation
from tests.parity.test_consolidation_parity import NOW_S, PARASERVE, FixedClock


@dataclass(frozen=True)
class Case:
    arrivals_ago_s: tuple[float, ...]
    queued: int
    size: int
    """Members of the group (one per machine, in stage order)."""
    warm: int | None = None
    """A member whose machine holds a host copy (it prefetches nothing)."""
    system: SystemConfig = PARASERVE


CASES = {
    "quiet": Case((5.0,), 0, 4),
    "busy": Case((1.0,) * 20, 4, 4),
    "busy-first-warm": Case((1.0,) * 20, 4, 4, warm=0),
    "scale-up": Case((5.0,), 0, 3, system=replace(PARASERVE, consolidation="scale-up")),
    "scale-up-one-warm": Case((5.0,), 0, 3, 1, replace(PARASERVE, consolidation="scale-up")),
    "no-consolidation": Case((1.0,) * 20, 0, 3, system=replace(PARASERVE, consolidation="none")),
}


def _parts(case: Case) -> tuple[tuple[int, ...], ...]:
    return split_blocks((1,) * case.system.num_blocks, case.size)


def _runtime(case: Case) -> list[int]:
    async def run() -> list[int]:
        server = Server(FakeClient(), "m", clock=FixedClock())  # type: ignore[arg-type]
        server.arrivals.extend(NOW_S - a for a in sorted(case.arrivals_ago_s, reverse=True))
        server.queue.extend(SimpleNamespace() for _ in range(case.queued))  # type: ignore[misc]
        manifest = SimpleNamespace(num_blocks=case.system.num_blocks)
        ctx = SimpleNamespace(system=case.system, server=server, manifest=manifest)
        group = SimpleNamespace(members=tuple(range(case.size)), parts=_parts(case))
        tiers = {m: "host" if m == case.warm else "remote" for m in range(case.size)}
        plans = prefetch_plans(ctx, group, tiers)  # type: ignore[arg-type]
        return sorted(m for m, p in plans.items() if p.rest)

    return asyncio.run(run())


def _sim(case: Case, tmp_path) -> list[int]:
    sim = simulation(tmp_path, case.system, case.size, "registry")
    if case.warm is not None:
        add_host_copy(sim, case.warm)
    pool = entry_pool(sim)
    pool.arrivals_s.extend(NOW_S - a for a in sorted(case.arrivals_ago_s, reverse=True))
    pool.queue.extend(SimRequest(-1 - r, 0, 0.0, 1, 1) for r in range(case.queued))
    sim.world.loop.now_s = NOW_S
    workers = [(m.first_gpu,) for m in sim.world.state.machines]
    member_bytes = [len(p) for p in _parts(case)]
    return sorted(sim.groups.prefetch_rests(pool, workers, member_bytes))


@pytest.mark.parametrize("name", list(CASES))
def test_both_bodies_prefetch_on_the_same_members(name: str, tmp_path) -> None:
    case = CASES[name]
    assert _runtime(case) == _sim(case, tmp_path)


def test_the_cases_exercise_every_outcome(tmp_path) -> None:
    """Not vacuous: one member, several, all cold ones, a warm one skipped, none."""
    got = {}
    for n, c in CASES.items():
        (tmp_path / n).mkdir()
        got[n] = _sim(c, tmp_path / n)
    assert got == {
        "quiet": [0],
        "busy": [0, 1, 2],
        "busy-first-warm": [1, 2],
        "scale-up": [0, 1, 2],
        "scale-up-one-warm": [0, 2],
        "no-consolidation": [],
    }
