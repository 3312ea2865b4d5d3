"""Scaling: the autoscaler's decisions carried out, GPUs accounted.

In: autoscaler checks (`check_soon` at the next decision tick, `check_after_idle` after
the downscale delay, or a `wake_at_s` the policy asks for). Out: scale-outs (placement by
`surge.policy.placement.place`, then the loads `start_load` carries out), releases; GPUs
are held and given back through `sim/gpus.py`'s `Gpus` (the GPU time series). Every
decision is `surge.policy.autoscale.decide` with the pool's `AutoscaleState` and the
system's settings; under P/D each decision is first a look of the P/D monitor
(`policy.blitzscale.pd_mutation.look`, `sim/pd.py`: BlitzScale §5.2 mutation, and the monitor's
wish for one more instance, added by `policy.blitzscale.pd.with_monitor`), and each
scale-out of a system that mutates carries out `policy.blitzscale.pd_mutation.scale_out_mutations`
(`PdPool.scale_out`), as `surge serve`'s autoscaler tick does (`control/pd.py`,
`control/autoscaler.py`). New instances are built by `sim/instance_factory.py`'s
`InstanceFactory`.
"""

import dataclasses
import math
from collections.abc import Callable

from surge.events import InstanceDrained, ScaleOutStarted
from surge.policy.autoscale import PoolLoad, ScaleDecision, decide
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.blitzscale.pd import with_monitor
from surge.policy.placement import MachineView, PlacementRequest, place, prefers_host_copy
from surge.sim.events import Priority
from surge.sim.gpus import Gpus
from surge.sim.host_cache import HostCache
from surge.sim.instance import Instance
from surge.sim.instance_factory import InstanceFactory
from surge.sim.placement import Placement
from surge.sim.pools import Pool, Requests
from surge.sim.world import KEY_STRIDE, World


class Scaler:
    """Autoscaling of every pool."""

    def __init__(
        self,
        world: World,
        pools: dict[tuple[int, str], Pool],
        requests: Requests,
        gpus: Gpus,
        factory: InstanceFactory,
        cache: HostCache,
        start_load: Callable[[Pool, list[Instance]], None],
        start_groups: Callable[[Pool, int], int],
        ready: Callable[[Pool, Instance, float], None],
        on_decide: Callable[[Pool], None] = lambda pool: None,
        adjust: Callable[[Pool, AutoscaleSettings], AutoscaleSettings] = lambda p, s: s,
    ) -> None:
        self.world = world
        self.on_decide = on_decide
        """Called at every decision (FlexPipe's granularity controller runs then); a second
        call at one instant with nothing run in between must change nothing (FlexPipe
        decides at most once per interval), so repeated decisions in a row are skipped."""
        self.adjust = adjust
        """The pool's autoscaler settings from the system's (FlexPipe: per pipeline)."""
        self.pools = pools
        self.requests = requests
        self.gpus = gpus
        self.factory = factory
        self.cache = cache
        self.start_load = start_load
        """Load new instances' weights (local or multicast)."""
        self.start_groups = start_groups
        """Start ParaServe-style groups (`registry-parallel`); how many started."""
        self.ready = ready
        """Bring an instance up after a delay (warm or `ideal` starts)."""
        self.check_pending: set[int] = set()
        self._wakes: dict[tuple[int, float], list[int]] = {}
        """Pending wake-ups per (pool index, time): how many decisions asked for each."""
        self._last: dict[int, tuple[float, PoolLoad, AutoscaleSettings, ScaleDecision]] = {}
        """Per pool: the last decision that changed nothing, with its time and inputs."""

    # --- when to decide -------------------------------------------------------------
    def _at(self, pool: Pool, time_s: float, times: int = 1) -> None:
        """Decide at `time_s`. Every decision of a quiet pool asks for the same wake-up
        (an idle instance's delay), so many ask for one instant: they share one event
        that decides as many times in a row, which is the order separate events at one
        (time, class, key) run in (a `check_soon` at that instant closes the group)."""
        group = (pool.index, time_s)
        count = self._wakes.get(group)
        if count is not None:
            count[0] += times
            return
        count = [times]
        self._wakes[group] = count

        def wake() -> None:
            if self._wakes.get(group) is count:
                del self._wakes[group]
            left, now_s = count[0], self.world.loop.now_s
            while left:
                left -= 1
                if self.autoscale(pool) and left < count[0] - 1:
                    # it repeated the decision just before it, in this event: nothing
                    # changed (`on_decide` included, see __init__), so the rest repeat too
                    wake_at_s = self._last[pool.index][3].wake_at_s
                    if left and wake_at_s is not None and wake_at_s > now_s:
                        self._at(pool, wake_at_s + 1e-9, left)
                    return

        self.world.loop.schedule(time_s, Priority.CONTROL, 2 * KEY_STRIDE + pool.index, wake)

    def check_soon(self, pool: Pool) -> None:
        """Decide at the next decision tick (arrivals of one tick batch into one check)."""
        if pool.index in self.check_pending:
            return
        self.check_pending.add(pool.index)
        tick = self.world.system.decision_interval_s
        at = (math.floor(self.world.loop.now_s / tick) + 1) * tick

        def check() -> None:
            self.check_pending.discard(pool.index)
            self.autoscale(pool)

        self.world.loop.schedule(at, Priority.CONTROL, 2 * KEY_STRIDE + pool.index, check)
        self._wakes.pop((pool.index, at), None)  # later wake-ups at `at` run after it

    def check_after_idle(self, pool: Pool) -> None:
        """An endpoint emptied: decide once the downscale delay has passed."""
        delay = self.world.system.autoscale.downscale_delay_s
        self._at(pool, self.world.loop.now_s + delay + 1e-9)

    # --- deciding -------------------------------------------------------------------
    def autoscale(self, pool: Pool) -> bool:
        """One `surge.policy.autoscale.decide` call for `pool`, carried out; True if it
        repeated the pool's last decision (nothing changed since, at the same instant)."""
        now = self.world.loop.now_s
        settings = self.adjust(pool, self.world.system.autoscale)
        wants = self.pd_look(pool, now)
        load = pool_load(pool, now, monitor=True)
        if not wants and self._repeats(pool, now, load, settings):
            self._carry_out(pool, self._last[pool.index][3])
            return True
        decision = decide(load, settings, pool.autoscale_state)
        if wants:
            room = settings.max_replicas is None or len(pool.instances) < settings.max_replicas
            serving = all(i.serving for i in pool.instances)
            more = with_monitor(decision.scale_out, wants, serving, room)
            decision = dataclasses.replace(decision, scale_out=more)
        if decision.scale_out or decision.release:
            self._last.pop(pool.index, None)
        else:
            self._last[pool.index] = (now, load, settings, decision)
        self._carry_out(pool, decision)
        return False

    def pd_look(self, pool: Pool, now_s: float) -> int:
        """P/D: one look of the monitor (a mutation carried out); the instances it wants
        on top of the autoscaler's (0 or 1)."""
        if pool.pd is None:
            return 0
        seen = pool.pd.look(now_s, len(pool.queue))
        if seen.mutation is not None:
            self.world.event(pool.model, pool.role, "mutate")
            self.requests.drain(pool)  # the new decode instance takes waiting hand-offs
        return seen.monitor.scale_out

    def _repeats(
        self, pool: Pool, now_s: float, load: PoolLoad, settings: AutoscaleSettings
    ) -> bool:
        """Whether `decide` would return the pool's last decision: `decide` is pure, and a
        decision that changed nothing, fed its own state with the same load and settings
        at the same instant, returns itself (`policy.autoscale.decide`)."""
        last = self._last.get(pool.index)
        return (
            last is not None
            and last[0] == now_s
            and last[3].state == pool.autoscale_state
            and last[1] == load
            and last[2] == settings
        )

    def _carry_out(self, pool: Pool, decision: ScaleDecision) -> None:
        now = self.world.loop.now_s
        pool.autoscale_state = decision.state
        if decision.wake_at_s is not None and decision.wake_at_s > now:
            self._at(pool, decision.wake_at_s + 1e-9)
        if decision.scale_out:
            before = len(pool.instances)
            self.scale_out(pool, decision.scale_out)
            if pool.pd is not None:  # §5.2: decode grows by mutation as the new ones load
                added = len(pool.instances) - before
                mutated = pool.pd.scale_out(now, len(pool.queue), added)
                for _ in range(mutated):
                    self.world.event(pool.model, pool.role, "mutate")
                if mutated:
                    self.requests.drain(pool)
        release = decision.release if pool.pd is None else pool.pd.releasable(decision.release)
        for iid in release:
            # a release lets other pools decide at once, and a decode pool's scale-out may
            # mutate (take over) an idle prefill instance this decision meant to release
            inst = next((i for i in pool.instances if i.id == iid), None)
            if inst is not None:
                self.release(pool, inst)
        self.on_decide(pool)

    # --- carrying out ---------------------------------------------------------------
    def place(self, pool: Pool, count: int, gpus_per_instance: int) -> tuple[tuple[int, ...], ...]:
        """GPUs for `count` instances of `pool` (`surge.policy.placement`)."""
        state = self.world.state
        slot = self.world.models[pool.model]
        views = [
            MachineView(
                m.index,
                state.free_on(m),
                self.cache.has_copy(m.index, pool.model),
                state.nic_load(m.index),
            )
            for m in state.machines
            if m.group is slot.group
        ]
        prefer_host = prefers_host_copy(self.world.system)
        return place(views, PlacementRequest(gpus_per_instance, count, prefer_host))

    def scale_out(self, pool: Pool, count: int, warm: bool = False) -> None:
        """Add `count` instances to `pool` (fewer when GPUs run out)."""
        sys, world = self.world.system, self.world
        if sys.load == "registry-parallel" and not warm:
            started = self.start_groups(pool, count)
            if started:
                world.event(pool.model, pool.role, "scale-out", started)
            return
        slot = world.models[pool.model]
        instances = []
        for gpus in self.place(pool, count, slot.tp):
            self.gpus.take(gpus)
            placement = Placement((gpus,), world.state.machine_of_gpu[gpus[0]].index)
            instances.append(self.factory.make(pool, placement))
        if not instances:
            return
        pool.instances.extend(instances)
        world.event(pool.model, pool.role, "scale-out", len(instances))
        machines = tuple(i.machine for i in instances)
        world.publish(ScaleOutStarted, model=slot.name, nodes=machines)
        if warm or sys.load == "ideal":
            for inst in instances:
                self.ready(pool, inst, 0.0 if warm else sys.init_s)
            return
        self.start_load(pool, instances)

    def release(self, pool: Pool, inst: Instance) -> None:
        """Give `inst` back; other pools waiting for GPUs get a chance at once."""
        inst.released = True
        pool.instances.remove(inst)
        if pool.pd is not None:  # what was parked on it is prefilled again
            self.requests.lost(pool, pool.pd.leave(inst))
        self.gpus.give_back_placement(inst.placement)
        self.world.event(pool.model, pool.role, "release")
        name = self.world.models[pool.model].name
        self.world.publish(InstanceDrained, model=name, node=inst.machine)
        self.cache.touch(inst.machine, pool.model)
        self.wake_waiting(pool)

    def wake_waiting(self, skip: Pool | None = None) -> None:
        """Every pool with queued requests (but `skip`) decides again: GPUs were released
        or, for ParaServe, a fetch ended and Alg. 2 may offer a share it refused."""
        for other in self.pools.values():
            if other.queue and other is not skip:
                self.autoscale(other)


def pool_load(pool: Pool, now_s: float, monitor: bool = False) -> PoolLoad:
    """The pool as `policy.autoscale` sees it: its instances (loading until loaded; a
    multicast source or one awaiting a KV hand-off is busy; with `monitor`, the load
    monitor's tokens/s, here the decode rate now rather than the runtime's 2-s trailing
    window, and KV use, tokens reserved over capacity, and the prompt tokens of requests
    without a first token) and the requests waiting for one — at the router or on an
    execution pipeline. `surge serve` builds the same view
    (`control/load_monitor.pool_load`)."""
    queued = len(pool.queue) + sum(p.outstanding for p in pool.pipelines)
    pending = 0
    if monitor:  # prompt tokens without a first token yet: queued, waiting, prefilling
        pending = pool.queue.prompt_tokens + sum(  # kept as they change (`sim/held.py`)
            e.pending_prompt_tokens for e in every_endpoint(pool)
        )
    loads = []
    views, pd = pool.load_views, pool.pd
    views.prune(len(pool.instances))
    for i in pool.instances:  # every autoscaler look: each instance read once
        own = i.outstanding
        held = own + i.reserved if pd is None else pd.held(i)  # `Pool.held`
        if monitor:  # its heads read in one pass (`ServingEngine.monitor_reads`)
            idle_s, rate, kv = i.monitor_reads()
            cap = i.kv_capacity_tokens
            kv_use = min(1.0, kv / cap) if cap else 0.0  # tokens reserved over capacity
        else:
            idle_s, rate, kv_use = i.idle_since_s, 0.0, 0.0
        busy = not i.loaded or i.sending > 0
        idle_s = idle_s if i.sending == 0 and held == own else None
        loads.append(views.get(i.id, (held, busy, idle_s, rate, kv_use)))
    return PoolLoad(now_s, queued, tuple(loads), pending)


def every_endpoint(pool: Pool) -> list[Instance]:
    """Every endpoint of `pool`: its instances, loading ones too, and open execution
    pipelines (`Pool.endpoints` is what the router may choose: serving, P/D-routable)."""
    return [*pool.instances, *pool.pipelines]
