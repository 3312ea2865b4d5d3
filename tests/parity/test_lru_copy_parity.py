"""ServerlessLLM's LRU host cache fills the same way in both bodies (`host_cache` `lru`): a load
of a model into a node's GPU memory from the registry leaves a copy in that node's host
memory, evicting the least recently used unpinned copies that must make room, refreshing a
copy held already, keeping none when it cannot fit. In `surge serve` the scale-out's load
(`runtime/scaleout/local.load_blocks`) asks the controller (`control/scaleout_side.
DeploymentSide.keep_host_copy` -> `control/copies.Copies.lru_copy`) and the agent reads the
model through its host tier (`LoadOp.keep_host`); in the simulator the fetch
(`sim/fetch.fetch`) touches the cache when its bytes have landed (`sim/host_cache.HostCache.
touch`). Both ask `policy.copies.host_copies.copy_after_load`. Before, the runtime's load
went straight to the GPU and its LRU cache never filled. Two loads onto one node at once
leave the same copies too: the runtime decides as a load starts, so a copy still arriving
holds its room (`Copies.arriving`); before, the second load saw it as free and the cache
ended one model over its capacity."""

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from surge.control.copies import Copies
from surge.control.pool import ParameterPool
from surge.control.scaleout_side import DeploymentSide
from surge.control.settings import ControllerConfig
from surge.policy.copies.keepalive import CacheEntry, CacheSettings
from surge.policy.systems import system_config
from surge.runtime.clock import Clock
from surge.runtime.protocol import Ack, EvictOp, LoadOp, Op
from surge.runtime.scaleout.local import load_blocks
from surge.sim.fetch import fetch
from tests.parity.sim_world import simulation

LAYERS = (8, 4, 6, 2, 12)
"""Model i (`tiny`, `tiny1`, ...) has LAYERS[i] layers: the sizes differ."""
BLOCKS = 4
NOW_S = 100.0
SYSTEM = replace(system_config("serverlessllm"), keep_alive_s=None)


@dataclass(frozen=True)
class Case:
    cached: tuple[tuple[int, float, bool], ...]
    """(model, last used, pinned) held in host memory before the load."""
    loaded: int | tuple[int, ...]
    """The model loaded into the GPU from the registry (several: at once, in this order)."""
    room: tuple[int, ...]
    """The cache's capacity: the sum of these models' sizes."""


CASES = {
    # an empty cache keeps the loaded model
    "fills": Case((), 0, (0,)),
    # the least recently used copy makes room (model 1, used at 10)
    "one-victim": Case(((0, 30.0, False), (1, 10.0, False), (2, 20.0, False)), 3, (0, 1, 2)),
    # a larger model: victims in LRU order until it fits
    "many-victims": Case(((0, 30.0, False), (1, 10.0, False), (2, 20.0, False)), 4, (0, 1, 2)),
    # the pinned copy is never a victim, though it is the oldest
    "pinned-stays": Case(((0, 5.0, True), (1, 10.0, False), (2, 20.0, False)), 3, (0, 1, 2)),
    # no room even with every unpinned copy gone: nothing kept, nothing evicted
    "refused": Case(((0, 5.0, True), (3, 10.0, False)), 4, (0, 3)),
    # a copy held already is refreshed, nothing evicted
    "refreshed": Case(((0, 10.0, False), (1, 5.0, False)), 1, (0, 1)),
    # two loads at once: each fits beside model 0, both only once model 0 has gone
    "two-at-once": Case(((0, 10.0, False),), (1, 2), (0, 2)),
}


def _name(i: int) -> str:
    return "tiny" if i == 0 else f"tiny{i}"


class FixedClock(Clock):
    def now_s(self) -> float:
        return NOW_S


class Agent:
    """The agents as the controller sees them: a load that keeps its host copy announces
    its blocks in the host tier (the pump adds them to the pool)."""

    def __init__(self, pool: ParameterPool) -> None:
        self.pool, self.down, self.ops = pool, set(), []

    async def call(self, node: int, op: Op) -> Any:
        self.ops.append(op)
        await asyncio.sleep(0)  # the blocks land after the load has started
        if isinstance(op, LoadOp) and getattr(op, "keep_host", False):  # (old code: none)
            self.pool.add(op.model, node, "host", op.blocks)
        if isinstance(op, EvictOp) and op.tier == "host":
            self.pool.remove(op.model, node, "host", op.blocks)
        return Ack()


Outcome = tuple[list[str], list[str], float | None]
"""Models in the node's host cache after the load, models evicted, the loaded model's last
use as a delta from the load (None: not held)."""


def _loads(case: Case) -> tuple[int, ...]:
    return (case.loaded,) if isinstance(case.loaded, int) else case.loaded


def _runtime(case: Case, sizes: list[int]) -> Outcome:
    pool = ParameterPool()
    agent = Agent(pool)
    config = ControllerConfig(
        state_dir=Path("/nonexistent"), host_cache_bytes=sum(sizes[i] for i in case.room)
    )
    deployments: dict[str, Any] = {}
    copies = Copies(agent, pool, deployments, config, lambda: [0], 0.0, FixedClock())  # type: ignore[arg-type]
    for i, nbytes in enumerate(sizes):
        pool.add_model(_name(i), BLOCKS)
        deployments[_name(i)] = SimpleNamespace(
            name=_name(i),
            manifest=SimpleNamespace(total_bytes=nbytes, num_blocks=BLOCKS),
            spec=SimpleNamespace(system=SYSTEM),
            host_last_used_s={},
            pinned_nodes=set(),
            instances={},
            spawn=asyncio.ensure_future,
        )
    for i, last_s, pinned in case.cached:
        pool.add(_name(i), 0, "host", list(range(BLOCKS)))
        deployments[_name(i)].host_last_used_s[0] = last_s
        deployments[_name(i)].pinned_nodes = {0} if pinned else set()
    ledger = SimpleNamespace(copies=copies)

    async def load_one(i: int) -> None:
        side = DeploymentSide(deployments[_name(i)], ledger, [])  # type: ignore[arg-type]
        ctx = SimpleNamespace(model=_name(i), client=agent, hooks=side)
        await load_blocks(ctx, 0, list(range(BLOCKS)), "remote")  # type: ignore[arg-type]

    async def load() -> None:
        await asyncio.gather(*(load_one(i) for i in _loads(case)))
        await asyncio.sleep(0)  # the evictions' calls
        await asyncio.sleep(0)

    asyncio.run(load())
    assert not getattr(copies, "arriving", {}).get(0), (
        "a finished load's copy still holds room as arriving"
    )
    dep = deployments[_name(_loads(case)[-1])]
    held = sorted(d.name for d in deployments.values() if pool.blocks_at(d.name, 0, "host"))
    evicted = sorted(op.model for op in agent.ops if isinstance(op, EvictOp))
    last = dep.host_last_used_s.get(0) if dep.name in held else None
    return held, evicted, None if last is None else last - NOW_S


def _sim(case: Case, tmp_path: Path) -> tuple[Outcome, list[int]]:
    sim = simulation(tmp_path, SYSTEM, 1, "registry", LAYERS, seed_host_copies=True)
    world = sim.world
    sizes = [slot.profile.total_bytes for slot in world.models]
    sim.cache.settings[0] = CacheSettings(sum(sizes[i] for i in case.room), None)
    names = {slot.name: _name(i) for i, slot in enumerate(world.models)}  # sim: file paths
    cache = world.state.host_cache[0]
    for i, last_s, pinned in case.cached:
        key = world.models[i].name
        cache[key] = CacheEntry(key, sizes[i], last_s, pinned)
    world.state.cached_machines.add(0)
    before = set(cache)
    world.loop.now_s = NOW_S
    landed: list[float] = []
    for i in _loads(case):
        fetch(world, sim.cache, i, (0,), sizes[i], False, lambda: landed.append(0.0))
    world.loop.run()
    assert len(landed) == len(_loads(case)), "a simulated load never landed"
    entry = cache.get(world.models[_loads(case)[-1]].name)
    # The simulator stamps the copy when its bytes have landed, the runtime when its load
    # starts (the agent needs the room first): both are "the load", 0 from its start here.
    last = None if entry is None else (0.0 if entry.last_used_s >= NOW_S else entry.last_used_s)
    held, evicted = sorted(names[k] for k in cache), sorted(names[k] for k in before - set(cache))
    return (held, evicted, last), sizes


@pytest.mark.parametrize("name", list(CASES))
def test_a_load_leaves_the_same_lru_host_copy_in_both_bodies(name: str, tmp_path) -> None:
    sim, sizes = _sim(CASES[name], tmp_path)
    assert _runtime(CASES[name], sizes) == sim


def test_the_cases_exercise_the_rule(tmp_path) -> None:
    """Not vacuous: filled, LRU victims, the pinned copy kept, a refusal, a refresh."""
    got = {}
    for n, c in CASES.items():
        (tmp_path / n).mkdir()
        got[n] = _sim(c, tmp_path / n)[0]
    assert got == {
        "fills": (["tiny"], [], 0.0),
        "one-victim": (["tiny", "tiny2", "tiny3"], ["tiny1"], 0.0),
        "many-victims": (["tiny4"], ["tiny", "tiny1", "tiny2"], 0.0),
        "pinned-stays": (["tiny", "tiny2", "tiny3"], ["tiny1"], 0.0),
        "refused": (["tiny", "tiny3"], [], None),
        "refreshed": (["tiny", "tiny1"], [], 0.0),
        "two-at-once": (["tiny1", "tiny2"], ["tiny"], 0.0),
    }


def test_two_loads_at_once_never_fill_the_cache_past_its_capacity(tmp_path) -> None:
    case = CASES["two-at-once"]
    sizes = _sim(case, tmp_path)[1]
    held = _runtime(case, sizes)[0]
    names = [_name(i) for i in range(len(sizes))]
    assert sum(sizes[names.index(m)] for m in held) <= sum(sizes[i] for i in case.room)
