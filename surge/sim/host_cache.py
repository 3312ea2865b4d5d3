"""Host-memory model caches of every machine: seed, touch, evict, expire.

In: the system's `host_cache` choice (`lru`, `pinned-one`, `pinned-lru`, `all`, `none`), its
keep-alive and cache fraction, and the loads and releases the simulator carries out. Out: the
entries in `ClusterState.host_cache` (what `surge.policy.startup` sees as host copies and
`surge.policy.placement` as locality), and the lifetimes of evicted entries. Admission and
expiry are `surge.policy.copies.keepalive` decisions (LRU + keep-alive, ServerlessLLM).
"""

from collections.abc import Callable

from surge.policy.copies.host_copies import (
    NodeHostCache,
    caches_after_load,
    copy_after_load,
    kept_copies,
)
from surge.policy.copies.keepalive import CacheEntry, CacheSettings, expired
from surge.sim.world import World


class HostCache:
    """The host caches of one run."""

    def __init__(self, world: World) -> None:
        self.world = world
        sys = world.system
        self.settings = [
            CacheSettings(
                int(m.group.host_memory_bytes * sys.host_cache_fraction), sys.keep_alive_s
            )
            for m in world.state.machines
        ]
        self.since: dict[tuple[int, str], float] = {}
        """When each entry came in (for lifetimes)."""
        self.in_flight: dict[tuple[int, int], list[Callable[[bool], None]]] = {}
        """(machine, model index) whose copy is on its way into host memory (`lru`), and
        the loads waiting for it, told whether the cache took it (`sim/fetch.py`)."""

    def seed(self) -> None:
        """Fill the caches at time 0 with the copies each model keeps by the system's
        `host_cache` (`policy.copies.host_copies.kept_copies`, as `surge serve`'s controller
        at a deployment's creation): every own machine (`all`), one per model in model order
        (`pinned-one`: BlitzScale's O(1) host pool; `pinned-lru`: λScale's registered
        replica; the roomiest machine of the model's group, ties to the lowest index), none
        (`lru`, `none`)."""
        mode = self.world.system.host_cache
        state = self.world.state
        for slot in self.world.models:
            own = [m.index for m in state.machines if m.group is slot.group]
            caches = [NodeHostCache(m, tuple(state.host_cache[m].values())) for m in own]
            held = [m for m in own if slot.name in state.host_cache[m]]
            for copy in kept_copies(mode, caches, self.settings[own[0]], held):
                entry = CacheEntry(slot.name, slot.profile.total_bytes, 0.0, pinned=True)
                state.host_cache[copy.node][slot.name] = entry
                state.cached_machines.add(copy.node)

    def has_copy(self, machine: int, model: int) -> bool:
        """Whether host memory of `machine` holds `model`."""
        return self.world.models[model].name in self.world.state.host_cache[machine]

    def machines_with(self, model: int) -> tuple[int, ...]:
        """Machines whose host memory holds `model`, ascending."""
        name = self.world.models[model].name
        state = self.world.state
        return tuple(m for m in sorted(state.cached_machines) if name in state.host_cache[m])

    def touch(self, machine: int, model: int) -> bool:
        """`model` was just used from (or loaded into) host memory of `machine`; with
        an LRU cache (`lru`, `pinned-lru`) it is admitted (evicting what
        `policy.copies.host_copies.copy_after_load` says) or refreshed. Whether it is there
        now."""
        world = self.world
        if not caches_after_load(world.system.host_cache):
            return self.has_copy(machine, model)
        slot = world.models[model]
        cache = world.state.host_cache[machine]
        old = cache.get(slot.name)
        now = world.loop.now_s
        entry = CacheEntry(slot.name, slot.profile.total_bytes, now, old.pinned if old else False)
        if old is None:
            mode = world.system.host_cache
            decision = copy_after_load(mode, tuple(cache.values()), entry, self.settings[machine])
            if not decision.admit:
                return False
            for victim in decision.evict:
                self._evict(machine, victim)
            self.since[(machine, slot.name)] = now
        cache[slot.name] = entry
        world.state.cached_machines.add(machine)
        return True

    def expire(self) -> None:
        """Drop unpinned entries past their keep-alive (an LRU cache with a keep-alive
        only)."""
        sys = self.world.system
        if not caches_after_load(sys.host_cache) or sys.keep_alive_s is None:
            return
        now = self.world.loop.now_s
        state = self.world.state
        for m in sorted(state.cached_machines):
            for model in expired(tuple(state.host_cache[m].values()), now, self.settings[m]):
                self._evict(m, model)

    def _evict(self, machine: int, model: str) -> None:
        state = self.world.state
        del state.host_cache[machine][model]
        if not state.host_cache[machine]:
            state.cached_machines.discard(machine)
        since = self.since.pop((machine, model), None)
        if since is not None:
            self.world.result.cache_lifetimes_s.append(self.world.loop.now_s - since)
