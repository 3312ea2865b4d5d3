"""The simulation: requests, router, autoscaler, loads and scale-outs in virtual time.

In: a `Trace` and `SimSettings`. Out: a `SimResult`.

Per pool (a model, or one role of it under P/D disaggregation) the simulator keeps
instances, execution-pipeline endpoints and a router queue. Every decision is a call
into `surge.policy`: `router.route` picks an endpoint, `autoscale.decide` sizes the
pool, `placement.place` picks GPUs, `keepalive.admit/expired` manage host caches,
`multicast.plan_scale_out` plans a multicast whose transfers `MulticastRun` executes
as flows. The system (`systems.SystemConfig`) only selects among these.
"""

import functools
import logging
import math
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from surge.errors import SurgeError
from surge.policy.autoscale import AutoscaleState, InstanceLoad, PoolLoad, decide
from surge.policy.cluster import Cluster
from surge.policy.keepalive import CacheEntry, CacheSettings, admit, expired
from surge.policy.multicast import MulticastOutcome, MulticastRequest, plan_scale_out
from surge.policy.pipelines import Pipeline
from surge.policy.placement import MachineView, PlacementRequest, place
from surge.policy.router import Endpoint, route
from surge.policy.systems import SystemConfig, system_config
from surge.sim.cluster_state import ClusterState
from surge.sim.costs import cost_model
from surge.sim.events import EventLoop, Priority
from surge.sim.flows import FlowNetwork
from surge.sim.hardware import NodeGroup, load_cluster
from surge.sim.instance import Instance
from surge.sim.models import ModelProfile, load_model
from surge.sim.multicast_run import MulticastRun
from surge.sim.request import SimRequest
from surge.sim.result import SimResult
from surge.sim.settings import SimSettings
from surge.traces.request import Trace
from surge.traces.transform import clip_to_context

log = logging.getLogger(__name__)

WEIGHT_HEADROOM = 1.1
"""Weights plus activations take this much of their size in GPU memory."""
MIN_KV_FRACTION = 0.1
"""An instance needs at least this fraction of its GPU memory left for KV cache."""
KEY_STRIDE = 1_000_000
"""Event keys: requests use their id, instances KEY_STRIDE + id, pools 2*KEY_STRIDE + i."""


def expand_models(names: tuple[str, ...]) -> list[tuple[str, ModelProfile]]:
    """(distinct name, profile) per model; `NAME*N` gives N copies NAME#0..NAME#N-1."""
    out: list[tuple[str, ModelProfile]] = []
    for spec in names:
        base, star, count = spec.partition("*")
        profile = load_model(base)
        if not star:
            out.append((base, profile))
            continue
        try:
            n = int(count)
        except ValueError:
            raise SurgeError(f"model spec {spec!r}: use NAME*N with N an integer") from None
        if n < 1:
            raise SurgeError(f"model spec {spec!r}: N must be >= 1")
        out.extend((f"{base}#{i}", profile) for i in range(n))
    return out


@functools.lru_cache(maxsize=512)
def _plan(request: MulticastRequest) -> MulticastOutcome:
    return plan_scale_out(request)


class Pool:
    """Instances of one model in one role, and the requests waiting for them."""

    def __init__(self, index: int, model: int, role: str) -> None:
        self.index = index
        self.model = model
        self.role = role
        self.instances: list[Instance] = []
        self.pipelines: list[Instance] = []
        self.queue: deque[SimRequest] = deque()
        self.autoscale_state = AutoscaleState()


class Simulation:
    """One run of one system on one trace."""

    def __init__(
        self, trace: Trace, settings: SimSettings, system: SystemConfig | None = None
    ) -> None:
        self.settings = settings
        self.system: SystemConfig = system or system_config(settings.system)
        """The system's policies; `system` overrides the name (variants in benchmarks)."""
        self.loop = EventLoop()
        self.net = FlowNetwork(self.loop)
        self.profile = load_cluster(settings.cluster)
        self.state = ClusterState(self.profile, self.net)
        self.models = expand_models(settings.models)
        self.result = SimResult(
            settings.system,
            tuple(n for n, _ in self.models),
            np.zeros(0),
            np.zeros(0),
            np.zeros(0),
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
        )
        self.requests = self._requests(trace)
        roles = ("prefill", "decode") if self.system.pd_disaggregation else ("both",)
        self.pools: dict[tuple[int, str], Pool] = {}
        for m in range(len(self.models)):
            for role in roles:
                self.pools[(m, role)] = Pool(len(self.pools), m, role)
        self.group_of_model = [self._serving_group(p) for _, p in self.models]
        self.next_id = 0
        self.gpus_allocated = 0
        self.unfinished = len(self.requests)
        self.cache_settings = [
            CacheSettings(
                int(m.group.host_memory_bytes * self.system.host_cache_fraction),
                self.system.keep_alive_s,
            )
            for m in self.state.machines
        ]
        self.cache_since: dict[tuple[int, str], float] = {}
        self.cold_leader: dict[int, Instance] = {}
        """Per model: the instance loading the first copy from host or store."""
        self.pending_targets: dict[int, list[Instance]] = {}
        """Per model: instances waiting for the cold leader to multicast to them."""
        self.check_pending: set[int] = set()
        """Pools with an autoscaler check already scheduled."""
        self.busy: dict[int, Instance] = {}
        """Busy endpoints by id, when they share one host's cores (`shared_cores`)."""
        self.transfers = 0
        """Multicast block transfers in flight (CPU consumers under `shared_cores`)."""
        self._seed_host_caches()

    # --- setup --------------------------------------------------------------------
    def _requests(self, trace: Trace) -> list[SimRequest]:
        nm = len(self.models)
        index = trace.model_index % nm
        ins, outs = trace.input_tokens.copy(), trace.output_tokens.copy()
        clipped = 0
        for m, (_, prof) in enumerate(self.models):
            mask = index == m
            if not mask.any():
                continue
            sub, c = clip_to_context(trace.take(mask), prof.context_tokens)
            ins[mask], outs[mask] = sub.input_tokens, sub.output_tokens
            clipped += c
        self.result.clipped_requests = clipped
        self.result.arrival_s = trace.arrival_s.copy()
        self.result.output_tokens = outs
        self.result.model_index = index.astype(np.int64)
        return [
            SimRequest(i, int(index[i]), float(trace.arrival_s[i]), int(ins[i]), int(outs[i]))
            for i in range(trace.num_requests)
        ]

    def _tp(self, group: NodeGroup, nbytes: int) -> int | None:
        usable = group.gpu.memory_bytes * self.settings.kv_memory_fraction
        tp = 1
        while tp <= group.gpus_per_node:
            if nbytes * WEIGHT_HEADROOM / tp <= usable * (1 - MIN_KV_FRACTION):
                return tp
            tp *= 2
        return None

    def _serving_group(self, prof: ModelProfile) -> NodeGroup:
        """The node group a model runs on: the first where the fewest GPUs hold it."""
        best: tuple[int, int] | None = None
        for i, group in enumerate(self.profile.groups):
            nbytes = prof.total_bytes // self._stages()
            tp = self._tp(group, nbytes)
            if tp is not None and (best is None or tp < best[0]):
                best = (tp, i)
        if best is None:
            raise SurgeError(
                f"model {prof.name} does not fit on any machine of {self.profile.name}"
            )
        return self.profile.groups[best[1]]

    def _stages(self) -> int:
        return self.system.pipeline_size if self.system.load == "registry-parallel" else 1

    def _seed_host_caches(self) -> None:
        sys = self.system
        machines = [m for m in self.state.machines]
        for mi, (name, prof) in enumerate(self.models):
            group = self.group_of_model[mi]
            own = [m for m in machines if m.group is group]
            if sys.host_cache == "all":
                targets = own
            elif sys.host_cache == "pinned-one":
                targets = [own[mi % len(own)]]
            else:
                targets = []
            for m in targets:
                pinned = sys.host_cache == "pinned-one"
                self.state.host_cache[m.index][name] = CacheEntry(
                    name, prof.total_bytes, 0.0, pinned
                )

    # --- run ----------------------------------------------------------------------
    def run(self, on_progress: Callable[[float], None] | None = None) -> SimResult:
        """Simulate every request; return the result."""
        start = time.perf_counter()
        for req in self.requests:
            self.loop.schedule(
                req.arrival_s, Priority.ARRIVAL, req.id, functools.partial(self._arrive, req)
            )
        for (_m, _role), pool in self.pools.items():
            if self.settings.warm_instances:
                self._scale_out(pool, self.settings.warm_instances, warm=True)
        self.loop.schedule(0.0, Priority.SAMPLE, 0, self._sample)
        last = self.requests[-1].arrival_s if self.requests else 0.0
        self.loop.run(last + self.settings.max_drain_s, on_progress)
        res = self.result
        res.first_token_s = np.array([r.first_token_s for r in self.requests])
        res.done_s = np.array([r.done_s for r in self.requests])
        res.end_s = max(self.loop.now_s, last)
        res.num_events = self.loop.num_events
        res.wall_s = time.perf_counter() - start
        return res

    def _sample(self) -> None:
        self.result.samples.append(
            (self.loop.now_s, self.gpus_allocated, self.state.host_cache_bytes())
        )
        self._expire_caches()
        if self.unfinished:
            self.loop.schedule(
                self.loop.now_s + self.settings.sample_interval_s, Priority.SAMPLE, 0, self._sample
            )

    # --- requests -----------------------------------------------------------------
    def _pool_for(self, req: SimRequest, role: str | None = None) -> Pool:
        if role is None:
            role = "prefill" if self.system.pd_disaggregation else "both"
        return self.pools[(req.model, role)]

    def _arrive(self, req: SimRequest) -> None:
        pool = self._pool_for(req)
        if self._dispatch(pool, req):
            self.result.hot_requests += 1
        else:
            pool.queue.append(req)
        self._schedule_check(pool)

    def _schedule_check(self, pool: Pool) -> None:
        """Run the autoscaler at the next decision tick (arrivals are batched per tick)."""
        if pool.index in self.check_pending:
            return
        self.check_pending.add(pool.index)
        tick = self.system.decision_interval_s
        at = (math.floor(self.loop.now_s / tick) + 1) * tick

        def check() -> None:
            self.check_pending.discard(pool.index)
            self._autoscale(pool)

        self.loop.schedule(at, Priority.CONTROL, 2 * KEY_STRIDE + pool.index, check)

    def _endpoints(self, pool: Pool) -> list[Instance]:
        return [i for i in pool.instances if i.serving] + pool.pipelines

    def _dispatch(self, pool: Pool, req: SimRequest) -> bool:
        """Send `req` to an endpoint of `pool` if one has room."""
        eps = self._endpoints(pool)
        if not eps:
            return False
        views = [Endpoint(e.id, e.outstanding + e.reserved, e.max_batch, e.speed) for e in eps]
        chosen = route(views)
        if chosen is None:
            return False
        inst = next(e for e in eps if e.id == chosen)
        if pool.role == "decode" and req.kv_gpu >= 0:
            self._send_kv(req, inst)
        else:
            inst.submit(req)
        return True

    def _send_kv(self, req: SimRequest, inst: Instance) -> None:
        """Move a prefilled request's KV cache to decode instance `inst` (BlitzScale §6)."""
        inst.reserved += 1
        prof = self.models[req.model][1]
        path = self.state.gpu_to_gpu(req.kv_gpu, inst.gpus[0])
        nbytes = prof.kv_bytes_per_token * req.input_tokens

        def arrived() -> None:
            inst.reserved -= 1
            req.kv_gpu = -1
            if inst.released:
                self._requeue(self.pools[(req.model, "decode")], [req])
            else:
                inst.submit(req)

        self.net.start(path, nbytes, arrived)

    def _drain_queue(self, pool: Pool) -> None:
        while pool.queue:
            if not self._dispatch(pool, pool.queue[0]):
                return
            pool.queue.popleft()

    def _requeue(self, pool: Pool, reqs: list[SimRequest]) -> None:
        for req in reversed(reqs):
            pool.queue.appendleft(req)
        self._drain_queue(pool)

    def _on_first_token(self, req: SimRequest) -> None:
        pass

    def _on_done(self, inst: Instance, req: SimRequest) -> None:
        self.unfinished -= 1
        pool = self.pools[inst.pool_key]
        self._drain_queue(pool)
        if inst.outstanding == 0 and not pool.queue:
            delay = self.system.autoscale.downscale_delay_s
            self.loop.schedule(
                self.loop.now_s + delay + 1e-9,
                Priority.CONTROL,
                2 * KEY_STRIDE + pool.index,
                functools.partial(self._autoscale, pool),
            )

    def _on_prefilled(self, inst: Instance, req: SimRequest) -> None:
        req.kv_gpu = inst.gpus[0]
        decode = self.pools[(req.model, "decode")]
        if not self._dispatch(decode, req):
            decode.queue.append(req)
        self._schedule_check(decode)
        self._on_done_prefill(inst)

    def _on_done_prefill(self, inst: Instance) -> None:
        pool = self.pools[inst.pool_key]
        self._drain_queue(pool)
        if inst.outstanding == 0 and not pool.queue:
            self.loop.schedule(
                self.loop.now_s + self.system.autoscale.downscale_delay_s + 1e-9,
                Priority.CONTROL,
                2 * KEY_STRIDE + pool.index,
                functools.partial(self._autoscale, pool),
            )

    # --- autoscaling --------------------------------------------------------------
    def _autoscale(self, pool: Pool) -> None:
        sys = self.system
        settings = sys.autoscale
        if pool.role == "decode":
            settings = sys.decode_autoscale
        queued = len(pool.queue) + sum(p.outstanding for p in pool.pipelines)
        loads = tuple(
            InstanceLoad(
                i.id,
                i.outstanding + i.reserved,
                not i.loaded or i.sending > 0,
                i.idle_since_s if i.sending == 0 and i.reserved == 0 else None,
            )
            for i in pool.instances
        )
        decision = decide(PoolLoad(self.loop.now_s, queued, loads), settings, pool.autoscale_state)
        pool.autoscale_state = decision.state
        if decision.wake_at_s is not None and decision.wake_at_s > self.loop.now_s:
            self.loop.schedule(
                decision.wake_at_s + 1e-9,
                Priority.CONTROL,
                2 * KEY_STRIDE + pool.index,
                functools.partial(self._autoscale, pool),
            )
        if decision.scale_out:
            self._scale_out(pool, decision.scale_out)
        for iid in decision.release:
            inst = next(i for i in pool.instances if i.id == iid)
            self._release(pool, inst)

    def _release(self, pool: Pool, inst: Instance) -> None:
        inst.released = True
        pool.instances.remove(inst)
        self._free_gpus(inst.all_gpus)
        self.result.scale_events.append((self.loop.now_s, self._name(pool), "release", 1))
        if self.system.host_cache == "lru":
            self._touch_cache(inst.machine, pool.model)
        for other in self.pools.values():
            if other.queue and other is not pool:
                self._autoscale(other)

    def _name(self, pool: Pool) -> str:
        name = self.models[pool.model][0]
        return name if pool.role == "both" else f"{name}/{pool.role}"

    # --- GPUs and host caches ------------------------------------------------------
    def _alloc_gpus(self, gpus: tuple[int, ...]) -> None:
        self.state.free_gpus.difference_update(gpus)
        self.gpus_allocated += len(gpus)
        self.result.gpu_changes.append((self.loop.now_s, self.gpus_allocated))

    def _free_gpus(self, gpus: tuple[int, ...]) -> None:
        self.state.free_gpus.update(gpus)
        self.gpus_allocated -= len(gpus)
        self.result.gpu_changes.append((self.loop.now_s, self.gpus_allocated))

    def _expire_caches(self) -> None:
        if self.system.host_cache != "lru" or self.system.keep_alive_s is None:
            return
        for m, cache in enumerate(self.state.host_cache):
            for model in expired(tuple(cache.values()), self.loop.now_s, self.cache_settings[m]):
                self._evict(m, model)

    def _evict(self, machine: int, model: str) -> None:
        del self.state.host_cache[machine][model]
        since = self.cache_since.pop((machine, model), None)
        if since is not None:
            self.result.cache_lifetimes_s.append(self.loop.now_s - since)

    def _touch_cache(self, machine: int, model_index: int) -> None:
        name, prof = self.models[model_index]
        cache = self.state.host_cache[machine]
        old = cache.get(name)
        entry = CacheEntry(name, prof.total_bytes, self.loop.now_s, old.pinned if old else False)
        if old is None:
            decision = admit(tuple(cache.values()), entry, self.cache_settings[machine])
            if not decision.admit:
                return
            for victim in decision.evict:
                self._evict(machine, victim)
            self.cache_since[(machine, name)] = self.loop.now_s
        cache[name] = entry

    def _has_host_copy(self, machine: int, model_index: int) -> bool:
        return self.models[model_index][0] in self.state.host_cache[machine]

    # --- scale-out ----------------------------------------------------------------
    def _new_instance(self, pool: Pool, gpus: tuple[int, ...], all_gpus: tuple[int, ...]):
        _name, prof = self.models[pool.model]
        group = self.group_of_model[pool.model]
        tp = len(gpus)
        cost = cost_model(prof, group.gpu, tp)
        mem = group.gpu.memory_bytes * self.settings.kv_memory_fraction * len(all_gpus)
        kv_bytes = max(mem - prof.total_bytes * WEIGHT_HEADROOM, mem * MIN_KV_FRACTION)
        kv_tokens = int(kv_bytes // prof.kv_bytes_per_token)
        self.next_id += 1
        hop = (len(all_gpus) // tp - 1) * self.system.stage_hop_s
        inst = Instance(
            KEY_STRIDE + self.next_id,
            self.loop,
            cost,
            pool.role,
            self.settings.max_batch,
            kv_tokens,
            self.settings.max_prefill_tokens,
            self._on_first_token,
            self._on_done,
            self._on_prefilled,
            1.0,
            hop,
        )
        inst.pool_key = (pool.model, pool.role)
        if self.settings.shared_cores is not None:
            inst.on_busy = self._on_busy
        inst.gpus = gpus
        inst.all_gpus = all_gpus
        inst.machine = self.state.machine_of_gpu[gpus[0]].index
        inst.serving = False
        inst.loaded = False
        inst.released = False
        inst.sending = 0
        inst.reserved = 0
        return inst

    def _on_busy(self, inst: Instance) -> None:
        """Processor sharing of `shared_cores`: each busy endpoint gets min(1, cores/n),
        n = busy endpoints + `transfer_cores` per block transfer in flight."""
        if inst.busy:
            self.busy[inst.id] = inst
        else:
            self.busy.pop(inst.id, None)
        self._reshare()

    def _on_transfers(self, delta: int) -> None:
        self.transfers += delta
        if self.settings.shared_cores is not None and self.settings.transfer_cores > 0:
            self._reshare()

    def _reshare(self) -> None:
        """Every consumer gets the same fraction of what it needs: endpoints one core each,
        block transfers `transfer_cores` each (they slow down too: `FlowNetwork.speed`)."""
        demand = len(self.busy) + self.settings.transfer_cores * self.transfers
        share = min(1.0, self.settings.shared_cores / demand) if demand > 0 else 1.0
        if self.settings.transfer_cores > 0:
            self.net.set_speed(share)
        for iid in sorted(self.busy):
            if self.busy[iid].share != share:
                self.busy[iid].set_share(share)

    def _place(self, pool: Pool, count: int, per_instance: int) -> tuple[tuple[int, ...], ...]:
        group = self.group_of_model[pool.model]
        views = [
            MachineView(
                m.index,
                self.state.free_on(m),
                self._has_host_copy(m.index, pool.model),
                self.state.nic_load(m.index),
            )
            for m in self.state.machines
            if m.group is group
        ]
        prefer_host = self.system.load in ("local", "multicast")
        return place(views, PlacementRequest(per_instance, count, prefer_host))

    def _scale_out(self, pool: Pool, count: int, warm: bool = False) -> None:
        sys = self.system
        if pool.role == "decode" and sys.mutation and not warm:
            count -= self._mutate(pool, count)
            if count <= 0:
                return
        prof = self.models[pool.model][1]
        group = self.group_of_model[pool.model]
        stages = self._stages()
        tp = self._tp(group, prof.total_bytes // stages) or 1
        instances: list[Instance] = []
        if stages > 1:
            for _ in range(count):
                workers = self._place(pool, stages, tp)
                if len(workers) < stages:
                    break
                flat = tuple(g for w in workers for g in w)
                self._alloc_gpus(flat)
                instances.append(self._new_instance(pool, workers[0], flat))
                instances[-1].workers = workers
        else:
            for gpus in self._place(pool, count, tp):
                self._alloc_gpus(gpus)
                inst = self._new_instance(pool, gpus, gpus)
                inst.workers = (gpus,)
                instances.append(inst)
        if not instances:
            return
        pool.instances.extend(instances)
        self.result.scale_events.append(
            (self.loop.now_s, self._name(pool), "scale-out", len(instances))
        )
        if warm or sys.load == "ideal":
            for inst in instances:
                self._ready(pool, inst, delay_s=0.0 if warm else sys.init_s)
            return
        if sys.load == "multicast":
            self._load_multicast(pool, instances)
        else:
            for inst in instances:
                self._load_local(pool, inst)

    def _mutate(self, decode: Pool, count: int) -> int:
        """Turn idle prefill instances into decode ones (BlitzScale §5.2); how many."""
        prefill = self.pools[(decode.model, "prefill")]
        idle = [i for i in prefill.instances if i.serving and i.outstanding == 0 and not i.sending]
        idle = [i for i in idle if i.reserved == 0][:count]
        for inst in idle:
            prefill.instances.remove(inst)
            inst.role = "decode"
            inst.pool_key = (decode.model, "decode")
            decode.instances.append(inst)
        if idle:
            self.result.scale_events.append(
                (self.loop.now_s, self._name(decode), "mutate", len(idle))
            )
            self._drain_queue(decode)
        return len(idle)

    def _ready(self, pool: Pool, inst: Instance, delay_s: float = 0.0) -> None:
        def go() -> None:
            if inst.released:
                return
            inst.serving = True
            inst.loaded = True
            inst.set_speed(1.0)
            inst.idle_since_s = self.loop.now_s if inst.outstanding == 0 else None
            if self.cold_leader.get(pool.model) is inst:
                del self.cold_leader[pool.model]
                waiting = self.pending_targets.pop(pool.model, [])
                if waiting:
                    self.result.network_loads += len(waiting)
                    self._multicast(pool, [inst], waiting)
            self._drain_queue(pool)

        if delay_s > 0:
            self.loop.schedule(self.loop.now_s + delay_s, Priority.INSTANCE, inst.id, go)
        else:
            go()

    def _load_local(self, pool: Pool, inst: Instance) -> None:
        """Load every worker's share from host memory (hit) or the model store (miss)."""
        sys = self.system
        prof = self.models[pool.model][1]
        workers = inst.workers
        share = prof.total_bytes / len(workers)
        left = [0]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                self._ready(pool, inst, sys.init_s)

        for w in workers:
            machine = self.state.machine_of_gpu[w[0]]
            hit = sys.load == "allcache" or self._has_host_copy(machine.index, pool.model)
            if hit:
                self.result.cache_hits += 1
            else:
                self.result.cache_misses += 1
            if sys.host_cache == "lru":
                self._touch_cache(machine.index, pool.model)
            for g in w:
                left[0] += 1
                path = (
                    self.state.host_to_gpu(g)
                    if hit
                    else self.state.store_to_gpu(g, self._store(machine.group))
                )
                self.net.start(path, share / len(w), one_done)

    def _store(self, group: NodeGroup) -> str:
        return group.model_store

    def _sources(self, model: int) -> list[Instance]:
        found = [
            i
            for (m, _), p in self.pools.items()
            if m == model
            for i in p.instances
            if i.serving and not i.released
        ]
        found.sort(key=lambda i: (i.outstanding, i.id))
        return found[: self.system.max_sources]

    def _load_multicast(self, pool: Pool, targets: list[Instance]) -> None:
        sys = self.system
        sources = self._sources(pool.model)
        if not sources:
            if sys.cold_fallback == "local":
                for inst in targets:
                    self._load_local(pool, inst)
                return
            leader = self.cold_leader.get(pool.model)
            if leader is not None and not leader.released:
                self.pending_targets.setdefault(pool.model, []).extend(targets)
                return
            self.cold_leader[pool.model] = targets[0]
            self.pending_targets[pool.model] = list(targets[1:])
            self._load_local(pool, targets[0])
            return
        self.result.network_loads += len(targets)
        if sys.group_setup_s > 0:
            self.loop.schedule(
                self.loop.now_s + sys.group_setup_s,
                Priority.CONTROL,
                targets[0].id,
                lambda: self._multicast(pool, sources, targets),
            )
        else:
            self._multicast(pool, sources, targets)

    def _multicast(self, pool: Pool, sources: list[Instance], targets: list[Instance]) -> None:
        sys = self.system
        prof = self.models[pool.model][1]
        live = [s for s in sources if not s.released and s.serving]
        if not live:
            for inst in targets:
                self._load_local(pool, inst)
            return
        nodes = live + targets
        leads = [i.gpus[0] for i in nodes]
        gbps = tuple(self.state.network_gbps(g) for g in leads)
        by_machine: dict[int, list[int]] = {}
        for v, g in enumerate(leads):
            by_machine.setdefault(self.state.machine_of_gpu[g].index, []).append(v)
        groups = tuple(tuple(v) for v in by_machine.values() if len(v) > 1)
        intra = min(m.group.intra_gpu_gbps for m in self.state.machines)
        busy = frozenset(v for v, s in enumerate(live) if s.role == "prefill" and s.outstanding)
        if len(busy) == len(live):
            busy = frozenset()
        cluster = Cluster(gbps, gbps, groups, intra, busy)
        blocks = sys.num_blocks
        request = MulticastRequest(
            len(nodes), blocks, len(live), sys.multicast_strategy, cluster, 1, 0.0
        )
        outcome = _plan(request)
        block_bytes = math.ceil(prof.total_bytes / blocks)
        for s in live:
            s.sending += 1
        formed: dict[int, Instance] = {}

        def on_block(node: int, count: int) -> None:
            inst = nodes[node]
            if sys.serve_while_loading != "live" or inst.serving or inst.released:
                return
            if count >= sys.live_start_fraction * blocks:
                inst.serving = True
                inst.set_speed(sys.live_speed)
                self._drain_queue(pool)

        def on_pipeline(p: Pipeline) -> None:
            if sys.serve_while_loading != "pipelines":
                return
            if any(nodes[s.node].released for s in p.stages):
                return
            member_gpus = tuple(g for v in p.nodes for g in nodes[v].gpus)
            ep = self._new_instance(pool, nodes[p.stages[0].node].gpus, member_gpus)
            ep.max_batch *= self.settings.pipeline_micro_batches
            ep.serving = True
            ep.members = p.nodes
            formed[id(p)] = ep
            ep.plan_pipeline = p
            pool.pipelines.append(ep)
            self.result.scale_events.append((self.loop.now_s, self._name(pool), "pipeline", 1))
            self._drain_queue(pool)

        def on_complete(node: int) -> None:
            for key, ep in list(formed.items()):
                if node in ep.members:
                    del formed[key]
                    pool.pipelines.remove(ep)
                    ep.released = True
                    self._requeue(pool, ep.drain())
            inst = nodes[node]
            if inst.released:
                return
            fanout = inst.gpus[1:]
            if not fanout:
                self._ready(pool, inst, sys.init_s)
                return
            left = [len(fanout)]

            def fan_done() -> None:
                left[0] -= 1
                if left[0] == 0:
                    self._ready(pool, inst, sys.init_s)

            for g in fanout:
                self.net.start(
                    self.state.gpu_to_gpu(inst.gpus[0], g),
                    prof.total_bytes / len(inst.gpus),
                    fan_done,
                )

        def on_finished() -> None:
            for s in live:
                s.sending -= 1

        MulticastRun(
            self.state,
            outcome,
            leads,
            block_bytes,
            on_block,
            on_pipeline,
            on_complete,
            on_finished,
            self._on_transfers,
        ).start()


def simulate(
    trace: Trace,
    settings: SimSettings,
    on_progress: Callable[[float], None] | None = None,
    system: SystemConfig | None = None,
) -> SimResult:
    """Run `settings.system` (or the given `system` variant) on `trace`."""
    return Simulation(trace, settings, system).run(on_progress)
