"""Loading new instances' weights: start-up plans, local loads, cold leaders, readiness.

In: new instances of a pool (`load`). Out: flows on the cluster's links (local loads,
a cold leader's store -> host copy), multicasts handed to `MulticastLoads`
(`sim/multicast_load.py`: the multicast and serving while loading), and instances
serving once they hold the whole model (`ready`). The decision is a policy call: where
each destination's weights come from, which copies are multicast sources (GPU copies of
serving instances and host copies in machines' memory alike, FaaScale §5), and which
destination is the cold leader: `surge.policy.startup.plan_startup`.
Plan nodes are start-up ids: an instance's id, or `HOST_NODE + m` for the host copy of
machine m. A host source's blocks leave its machine's NIC from host memory; a
warm-local destination or a cold leader is a host source too (its own GPU loads over
PCIe meanwhile).
"""

import functools
from collections.abc import Callable

from surge.events import InstanceUp
from surge.policy.startup import (
    Copy,
    Destination,
    StartupRequest,
    plan_startup,
    serving_at_s,
)
from surge.policy.warm_pipelines import WarmGroup, plan_warm_groups
from surge.sim.events import Priority
from surge.sim.fetch import fetch
from surge.sim.host import HostModel
from surge.sim.host_cache import HostCache
from surge.sim.instance import Instance
from surge.sim.live_scaling import LiveScaling
from surge.sim.loading_actions import LoadingActions
from surge.sim.multicast_load import MulticastLoads
from surge.sim.placement import Placement
from surge.sim.pools import Pool, Requests
from surge.sim.warm_load import start_warm_group
from surge.sim.world import HOST_NODE, World


class Loader:
    """Start-ups of every pool: local loads here, multicasts in `self.multicasts`."""

    def __init__(
        self,
        world: World,
        pools: dict[tuple[int, str], Pool],
        requests: Requests,
        cache: HostCache,
        make_endpoint: Callable[[Pool, Placement, bool], Instance],
        host: HostModel,
        num_blocks: Callable[[int, int, int], int],
    ) -> None:
        self.world = world
        self.pools = pools
        self.requests = requests
        self.cache = cache
        self.make_endpoint = make_endpoint
        self.host = host
        """Told of every transfer, and what each loading action costs (`HostModel`)."""
        self.staging: dict[int, list[Instance]] = {}
        """Per model: instances waiting for a cold leader's host copy."""
        self.live = LiveScaling(world, requests)
        """BlitzScale live targets (`serve_while_loading="live"`)."""
        self.staged: set[tuple[int, int]] = set()
        """(machine, model) whose host copy a cold leader brought in (counts as a host
        copy even where the cache policy did not keep it)."""
        self.actions = LoadingActions(world, requests, self.live, make_endpoint, self.ready)
        """Loading actions carried out, a multicast's and a warm group's alike."""
        self.multicasts = MulticastLoads(
            world, pools, self.live, self.actions, host, num_blocks, self.load_local
        )

    # --- readiness ------------------------------------------------------------------
    def ready(self, pool: Pool, inst: Instance, delay_s: float = 0.0) -> None:
        """`inst` holds the whole model: after `delay_s` (engine start) it serves alone."""

        def go() -> None:
            if inst.released:
                self.actions.mode_switch.hand_over(pool, inst)  # its mode-switch share goes back
                return
            inst.serving = True
            inst.loaded = True
            self.world.result.endpoints_up.setdefault(
                inst.id, (self.world.loop.now_s, len(inst.placement.workers))
            )
            if pool.pd is not None:  # P/D: its role before its first request
                pool.pd.join(inst, len(pool.queue))
            inst.idle_since_s = self.world.loop.now_s if inst.outstanding == 0 else None
            name = self.world.models[pool.model].name
            self.world.publish(
                InstanceUp, model=name, node=inst.machine, name=f"{name}-m{inst.machine}"
            )
            self.actions.mode_switch.hand_over(pool, inst)  # λScale §4.4: its share first
            self.requests.drain(pool)
            self.live.redistribute(pool, inst)

        if delay_s > 0:
            self.world.loop.schedule(
                self.world.loop.now_s + delay_s, Priority.INSTANCE, inst.id, go
            )
        else:
            go()

    # --- start-up -------------------------------------------------------------------
    def load(self, pool: Pool, instances: list[Instance]) -> None:
        """Bring `instances` up as the system's start-up plan says."""
        waiting = self.staging.get(pool.model)
        if waiting is not None:  # a cold leader is bringing the first host copy in
            waiting.extend(instances)
            return
        self._start(pool, instances)

    def _own_tier(self, inst: Instance, pool: Pool) -> str:
        if self.world.system.load == "allcache":
            return "host"
        m = inst.machine
        if self.cache.has_copy(m, pool.model) or (m, pool.model) in self.staged:
            return "host"
        return "disk" if self.world.models[pool.model].group.model_store == "ssd" else "remote"

    def startup_request(self, pool: Pool, instances: list[Instance]) -> StartupRequest:
        """What `policy.startup` is asked for `instances`: each one's own tier, the GPU
        copies of serving instances and the host copies of other machines (one id per
        machine: `HOST_NODE + m`), each named with the link its blocks leave by (a GPU's
        own NIC where the preset has one, else the machine NIC; BlitzScale §5.1 Alg. 1
        ranks sources by what that link has left). `surge serve` asks the same question
        (`control/scaleouts.startup_request`)."""
        state = self.world.state
        dest_machines = {i.machine for i in instances}
        model_instances = [
            i for (m, _), p in self.pools.items() if m == pool.model for i in p.instances
        ]

        def copy(i: Instance, tier: str) -> Copy:
            # a P/D prefill instance's egress carries K/V hand-offs (BlitzScale §5.1)
            busy = i.role == "prefill" and i.outstanding > 0
            return Copy(
                i.id,
                tier,
                i.outstanding,
                machine=i.machine,
                busy_egress=busy,
                sending=i.sending,
                egress=state.gpu_egress(i.gpus[0]),
            )

        gpu_copies = [
            copy(i, "gpu") for i in model_instances if i.loaded and i.serving and not i.released
        ]
        # Receivers of multicasts still in flight: chain tails a later multicast may
        # forward from (`policy.startup` tier `loading`, BlitzScale §5.1 Alg. 1 line 10).
        tails = [
            copy(i, "loading")
            for i in model_instances
            if i.id in self.multicasts.inflight and not i.released
        ]
        host_copies = [
            Copy(
                HOST_NODE + m,
                "host",
                machine=m,
                sending=self.multicasts.host_sending.get(m, 0),
                egress=state.host_egress(m),
            )
            for m in self.cache.machines_with(pool.model)
            if m not in dest_machines
        ]
        return StartupRequest(
            self.world.system,
            tuple(Destination(i.id, self._own_tier(i, pool), machine=i.machine) for i in instances),
            tuple(gpu_copies + host_copies + tails),
        )

    def _start(self, pool: Pool, instances: list[Instance]) -> None:
        world = self.world
        request = self.startup_request(pool, instances)
        plan = plan_startup(request)
        by_id = {i.id: i for i in instances}
        leader = plan.cold_leader
        if leader is not None:
            self._cold_leader(pool, by_id[leader.node], instances)
            return
        # λScale §5 warm start: warm-local instances load in rotated orders and serve as
        # execution pipelines meanwhile (`policy.warm_pipelines`), as `surge serve` does.
        groups: tuple[WarmGroup, ...] = ()
        if world.system.serve_while_loading == "pipelines":
            warm = tuple(x.node for x in plan.local if x.source == "host")
            groups = plan_warm_groups(warm, world.system.num_blocks)
        grouped = {n for g in groups for n in g.nodes}
        for load in plan.local:
            if load.node not in grouped:
                source = "host" if load.source == "host" else "store"
                self.load_local(pool, by_id[load.node], source)
        for g in groups:
            members = [by_id[n] for n in g.nodes]
            start_warm_group(
                self.actions, self.host, self.cache, pool, g, members, world.system.num_blocks
            )
        if plan.receivers:
            world.result.network_loads += len(plan.receivers)
            run = functools.partial(self.multicasts.start, pool, plan, by_id)
            if world.system.group_setup_s > 0:
                at = world.loop.now_s + world.system.group_setup_s
                world.loop.schedule(at, Priority.CONTROL, instances[0].id, run)
            else:
                run()

    def _cold_leader(self, pool: Pool, leader: Instance, instances: list[Instance]) -> None:
        """No copy in memory anywhere: the leader brings the model from the store into
        its host memory, then the start-up is planned again (the leader is now a host
        source, BlitzScale §5.1's one-host-copy invariant restored)."""
        world = self.world
        slot = world.models[pool.model]
        self.staging[pool.model] = list(instances)
        path = world.state.store_to_host(leader.machine, slot.group.model_store)
        world.result.cache_misses += 1

        def landed() -> None:
            self.staged.add((leader.machine, pool.model))
            self.cache.touch(leader.machine, pool.model)
            waiting = [i for i in self.staging.pop(pool.model) if not i.released]
            if waiting:
                self._start(pool, waiting)

        world.net.start(path, slot.profile.total_bytes, landed)

    def load_local(self, pool: Pool, inst: Instance, source: str) -> None:
        """Every GPU of `inst` loads its share from host memory or the model store."""
        world = self.world
        launch_s = world.loop.now_s

        def loaded() -> None:
            now = world.loop.now_s
            self.ready(pool, inst, serving_at_s(world.system, launch_s, now) - now)

        fetch(
            world,
            self.cache,
            pool.model,
            inst.all_gpus,
            world.models[pool.model].profile.total_bytes,
            source == "host",
            loaded,
        )
