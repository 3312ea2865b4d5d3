"""ParaServe consolidation parity (§6.1): a pipeline group that has served, seen with the same
arrivals in the sliding window and the same queue, keeps the same number of members as
instances in `surge serve` (`runtime/scaleout/paraserve.group_consolidation`, on the
deployment's `Server`) and in the simulator (`sim/consolidation.Consolidation.keep`, on
the pool): both call `policy.paraserve.predictor.consolidate_group`, which takes the
predictor's settings from the system. (The runtime used to build its own settings, one
request per worker where the simulator took the system's concurrency target: six arrivals
kept two members in `surge serve` and one in the simulator.)"""

import asyncio
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from surge.policy.systems import SystemConfig, system_config
from surge.runtime.clock import Clock
from surge.runtime.scaleout.paraserve import group_consolidation
from surge.runtime.server import Server
from surge.sim.request import SimRequest
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import entry_pool, simulation

PARASERVE = system_config("paraserve")
NOW_S = 500.0


@dataclass(frozen=True)
class Case:
    arrivals_ago_s: tuple[float, ...]
    """Arrival times, seconds before now."""
    queued: int
    size: int
    """Members of the group."""
    system: SystemConfig = PARASERVE


CASES = {
    "quiet": Case((5.0,), 0, 4),
    "six-arrivals": Case((1.0,) * 6, 0, 2),
    "busy": Case((1.0,) * 20, 4, 4),
    "window-passed": Case((100.0,) * 30, 0, 4),
    "scale-up": Case((5.0,), 0, 3, replace(PARASERVE, consolidation="scale-up")),
}


class FixedClock(Clock):
    def now_s(self) -> float:
        return NOW_S


def _runtime(case: Case) -> int:
    async def run() -> int:
        server = Server(FakeClient(), "m", clock=FixedClock())  # type: ignore[arg-type]
        server.arrivals.extend(NOW_S - a for a in sorted(case.arrivals_ago_s, reverse=True))
        server.queue.extend(SimpleNamespace() for _ in range(case.queued))  # type: ignore[misc]
        ctx = SimpleNamespace(system=case.system, server=server)
        return group_consolidation(ctx, case.size).keep  # type: ignore[arg-type]

    return asyncio.run(run())


def _sim(case: Case, tmp_path) -> int:
    sim = simulation(tmp_path, case.system, 1, "registry")
    pool = entry_pool(sim)
    pool.arrivals_s.extend(NOW_S - a for a in sorted(case.arrivals_ago_s, reverse=True))
    pool.queue.extend(SimRequest(-1 - r, 0, 0.0, 1, 1) for r in range(case.queued))
    sim.world.loop.now_s = NOW_S
    return sim.groups.consolidation.keep(pool, case.size)


@pytest.mark.parametrize("name", list(CASES))
def test_both_bodies_keep_the_same_members(name: str, tmp_path) -> None:
    case = CASES[name]
    assert _runtime(case) == _sim(case, tmp_path)


def test_the_cases_exercise_every_outcome(tmp_path) -> None:
    """Not vacuous: scale-down to one, scale-up to some, and every member kept."""
    kept = {}
    for n, c in CASES.items():
        (tmp_path / n).mkdir()
        kept[n] = _sim(c, tmp_path / n)
    # 24 requests at 8 per worker (paraserve's concurrency target): 3 of the 4 members
    assert kept == {"quiet": 1, "six-arrivals": 1, "busy": 3, "window-passed": 1, "scale-up": 3}
