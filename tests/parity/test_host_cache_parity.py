"""Host-cache parity (ServerlessLLM's LRU with a fixed capacity, λScale §2.3; BlitzScale §5.3's
pinned copy is never a victim): a node holding some models in host memory, each last used
at a given time, asked to take one more copy, evicts the same models — or refuses the copy
— in `surge serve` (`control/copies.Copies.make_host_copy`) and in the simulator
(`sim/host_cache.HostCache.touch`): both ask `policy.copies.keepalive.admit`. The cache's
capacity is given to both (the runtime's `ControllerConfig.host_cache_bytes`, the
simulator's per-machine `CacheSettings`). Node 0 of the runtime is machine 0."""

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from surge.control.copies import Copies
from surge.control.pool import ParameterPool
from surge.control.settings import ControllerConfig
from surge.policy.copies.keepalive import CacheEntry, CacheSettings
from surge.policy.systems import system_config
from surge.runtime.clock import Clock
from surge.runtime.protocol import Ack, EvictOp, LoadOp, Op
from tests.parity.sim_world import simulation

LAYERS = (8, 4, 6, 2, 12)
"""Model i (`tiny`, `tiny1`, ...) has LAYERS[i] layers: the sizes differ."""
NOW_S = 100.0
SYSTEM = replace(system_config("serverlessllm"), keep_alive_s=None)


@dataclass(frozen=True)
class Case:
    cached: tuple[tuple[int, float, bool], ...]
    """(model, last used, pinned) held in host memory now."""
    new: int
    """The model whose copy comes in."""
    room: tuple[int, ...]
    """The capacity: the sum of these models' sizes."""


CASES = {
    # the least recently used goes first (model 1, used at 10)
    "one-victim": Case(((0, 30.0, False), (1, 10.0, False), (2, 20.0, False)), 3, (0, 1, 2)),
    # a larger copy: victims in LRU order until it fits (here all three)
    "many-victims": Case(((0, 30.0, False), (1, 10.0, False), (2, 20.0, False)), 4, (0, 1, 2)),
    # the pinned copy is never a victim, though it is the oldest
    "pinned-stays": Case(((0, 5.0, True), (1, 10.0, False), (2, 20.0, False)), 3, (0, 1, 2)),
    # no room even with every unpinned copy gone: refused, nothing evicted
    "refused": Case(((0, 5.0, True), (3, 10.0, False)), 4, (0, 3)),
}


class FixedClock(Clock):
    def now_s(self) -> float:
        return NOW_S


def _name(i: int) -> str:
    return "tiny" if i == 0 else f"tiny{i}"


def _runtime(case: Case, sizes: list[int]) -> tuple[bool, list[str]]:
    calls: list[Op] = []

    class Client:
        def __init__(self) -> None:
            self.down: set[int] = set()

        async def call(self, node: int, op: Op) -> Any:
            calls.append(op)
            return Ack()

    pool, deployments = ParameterPool(), {}
    config = ControllerConfig(
        state_dir=Path("/nonexistent"), host_cache_bytes=sum(sizes[i] for i in case.room)
    )
    copies = Copies(
        Client(),  # type: ignore[arg-type]
        pool,
        deployments,  # type: ignore[arg-type]
        config,
        lambda: [0],
        started_s=0.0,
        clock=FixedClock(),
    )
    for i, nbytes in enumerate(sizes):
        pool.add_model(_name(i), 4)
        deployments[_name(i)] = SimpleNamespace(
            name=_name(i),
            manifest=SimpleNamespace(total_bytes=nbytes, num_blocks=4),
            host_last_used_s={},
            pinned_nodes=set(),
            spawn=asyncio.ensure_future,
        )
    for i, last_s, pinned in case.cached:
        pool.add(_name(i), 0, "host", list(range(4)))
        deployments[_name(i)].host_last_used_s[0] = last_s
        deployments[_name(i)].pinned_nodes = {0} if pinned else set()

    async def take_one() -> None:
        await copies.make_host_copy(deployments[_name(case.new)], 0, pin=False)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the evictions' calls

    asyncio.run(take_one())
    admitted = any(isinstance(op, LoadOp) for op in calls)
    evicted = sorted(op.model for op in calls if isinstance(op, EvictOp) and op.tier == "host")
    return admitted, evicted


def _sim(case: Case, tmp_path) -> tuple[bool, list[str], list[int]]:
    sim = simulation(tmp_path, SYSTEM, 1, "registry", LAYERS, seed_host_copies=True)
    sizes = [slot.profile.total_bytes for slot in sim.world.models]
    sim.cache.settings[0] = CacheSettings(sum(sizes[i] for i in case.room), None)
    cache = sim.world.state.host_cache[0]
    for i, last_s, pinned in case.cached:
        cache[_name(i)] = CacheEntry(_name(i), sizes[i], last_s, pinned)
    sim.world.state.cached_machines.add(0)
    before = set(cache)
    sim.world.loop.now_s = NOW_S
    admitted = sim.cache.touch(0, case.new)
    return admitted, sorted(before - set(cache)), sizes


@pytest.mark.parametrize("name", list(CASES))
def test_both_bodies_evict_the_same_copies(name: str, tmp_path) -> None:
    case = CASES[name]
    admitted, evicted, sizes = _sim(case, tmp_path)
    assert _runtime(case, sizes) == (admitted, evicted)


def test_the_cases_exercise_the_rule(tmp_path) -> None:
    """Not vacuous: LRU order, more than one victim, the pinned copy kept, a refusal."""
    got = {}
    for n, c in CASES.items():
        (tmp_path / n).mkdir()
        got[n] = _sim(c, tmp_path / n)[:2]
    assert got == {
        "one-victim": (True, ["tiny1"]),
        "many-victims": (True, ["tiny", "tiny1", "tiny2"]),
        "pinned-stays": (True, ["tiny1"]),
        "refused": (False, []),
    }
