"""The simulation: the loop and the wiring; every decision is a `surge.policy` call.

In: a `Trace` and `SimSettings` (and optionally a `SystemConfig` variant). Out: a
`SimResult`.

The parts, each one concern, dependencies passed in (no part imports another's state):
- `pools.Requests`: arrivals, dispatch through `policy.router.route`, requeue, P/D;
- `scaling.Scaler`: `policy.autoscale.decide`, placement, release, mutation, GPUs;
- `loading.Loader`: start-up by `policy.startup.plan_startup`, multicasts planned by
  `policy.multicast` and executed by `MulticastRun`, serve-while-loading by
  `policy.loading.LoadingState`;
- `groups.Groups`: ParaServe groups (`policy.paraserve.group_plan.plan_group`) and consolidation
  (`policy.paraserve.predictor`);
- `host_cache.HostCache`: `policy.copies.keepalive`;
- `host.HostModel`: what the machines' compute costs beside the GPUs' (`DedicatedHost`, a
  real cluster, unless a benchmark passes its own: `benchmarks/sim_calibrate/testbed.py`).
This module builds them, schedules the arrivals and the sampler, and runs the loop.
"""

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from surge.errors import SurgeError
from surge.events import DeploymentUp, NodesKnown, Recorder
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.blitzscale.monitor import InstanceCosts, profiled
from surge.policy.blitzscale.pd import PdTargets, serving_floor
from surge.policy.multicast.block_count import BlockCountSettings, choose_block_count
from surge.policy.multicast.cluster import Cluster
from surge.policy.placement import model_home
from surge.policy.slo import Slo
from surge.policy.systems import SystemConfig, system_config
from surge.sim.cluster_state import ClusterState
from surge.sim.costs import monitor_costs
from surge.sim.events import EventLoop, Priority
from surge.sim.flexpipe import FlexPipe
from surge.sim.flows import FlowNetwork
from surge.sim.gpus import Gpus
from surge.sim.groups import Groups
from surge.sim.hardware import ClusterProfile, load_cluster
from surge.sim.host import DedicatedHost, HostFactory
from surge.sim.host_cache import HostCache
from surge.sim.instance_factory import InstanceFactory, gpu_group
from surge.sim.loading import Loader
from surge.sim.models import ModelProfile, load_model
from surge.sim.pd import PdPool
from surge.sim.pools import Pool, Requests
from surge.sim.request import SimRequest
from surge.sim.result import SimResult, handoffs_of
from surge.sim.scaling import Scaler
from surge.sim.settings import SimSettings
from surge.sim.world import ModelSlot, World
from surge.traces.request import Trace
from surge.traces.transform import clip_to_context


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


def model_slot(
    name: str, prof: ModelProfile, cluster: ClusterProfile, system: SystemConfig, kv: float
) -> ModelSlot:
    """Where a model runs: the node group and tensor-parallel size
    `policy.placement.model_home` gives."""
    home = model_home([gpu_group(g) for g in cluster.groups], prof.total_bytes, system, kv)
    if home is None:
        raise SurgeError(f"model {prof.name} does not fit on any machine of {cluster.name}")
    index, tp = home
    return ModelSlot(name, prof, cluster.groups[index], tp)


class Simulation:
    """One run of one system on one trace."""

    def __init__(
        self,
        trace: Trace,
        settings: SimSettings,
        system: SystemConfig | None = None,
        timeline: Recorder | None = None,
        host: HostFactory | None = None,
    ) -> None:
        self.settings = settings
        self.host_factory = host
        """Builds the host model (None: `DedicatedHost`, every paper profile)."""
        self.system: SystemConfig = system or system_config(settings.system)
        """The system's policies; `system` overrides the name (variants in benchmarks)."""
        loop = EventLoop()
        net = FlowNetwork(loop)
        profile = (
            settings.cluster
            if isinstance(settings.cluster, ClusterProfile)
            else load_cluster(settings.cluster)
        )
        expanded = expand_models(settings.models)
        names = settings.model_names or tuple(n for n, _ in expanded)
        if len(names) != len(expanded) or len(set(names)) != len(names):
            raise SurgeError("model_names must name every expanded model once")
        models = tuple(
            model_slot(n, p, profile, self.system, settings.kv_memory_fraction)
            for n, (_, p) in zip(names, expanded, strict=True)
        )
        result = SimResult(
            settings.system,
            tuple(m.name for m in models),
            np.zeros(0),
            np.zeros(0),
            np.zeros(0),
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
        )
        self.world = World(
            loop, net, ClusterState(profile, net), self.system, settings, models, result, timeline
        )
        self._publish_start()
        self.requests = self._requests(trace)
        self._elbows: dict[tuple[int, int, int], int] = {}
        self.pools: dict[tuple[int, str], Pool] = {}
        sys = self.system

        def clock() -> float:
            return loop.now_s

        for m in range(len(models)):
            # P/D: one pool whose instances take roles, as a `surge serve` deployment
            pd = PdPool(sys.pd, PdTargets(), sys.mutation, clock) if sys.pd_disaggregation else None
            self.pools[(m, "both")] = Pool(m, m, "both", pd)
        self._wire()

    def _publish_start(self) -> None:
        """The dashboard's first picture (`--timeline`): machines as nodes, each model."""
        world = self.world
        world.publish(NodesKnown, nodes=tuple(m.index for m in world.state.machines))
        for slot in world.models:
            n, b = slot.profile.num_layers, self.system.num_blocks
            layers = tuple((i * n // b, (i + 1) * n // b) for i in range(b))
            world.publish(
                DeploymentUp,
                model=slot.name,
                strategy=self.settings.system,
                num_blocks=b,
                num_layers=n,
                block_layers=layers,
            )

    def _wire(self) -> None:
        world = self.world
        self.cache = HostCache(world)
        self.cache.seed()
        self.host = self.host_factory(world) if self.host_factory else DedicatedHost()
        self.router = Requests(
            world,
            self.pools,
            on_demand=lambda pool: self.scaler.check_soon(pool),
            on_idle=lambda pool: self.scaler.check_after_idle(pool),
        )
        self.router.unfinished = len(self.requests)
        self.gpus = Gpus(world)
        factory = InstanceFactory(world, self.router, self.host)
        self.loader = Loader(
            world,
            self.pools,
            self.router,
            self.cache,
            factory.make,
            self.host,
            self._num_blocks,
        )
        self.flexpipe = FlexPipe(world, self.gpus, lambda p: self.scaler.check_after_idle(p))
        self.groups = Groups(
            world,
            self.router,
            self.cache,
            self.gpus,
            factory.make,
            lambda pool, n, tp: self.scaler.place(pool, n, tp),
            self.loader.ready,
            self.flexpipe,
            lambda: self.scaler.wake_waiting(),
        )
        self.scaler = Scaler(
            world,
            pools=self.pools,
            requests=self.router,
            gpus=self.gpus,
            factory=factory,
            cache=self.cache,
            start_load=self.loader.load,
            start_groups=self.groups.start,
            ready=self.loader.ready,
            on_decide=self.flexpipe.retune,
            adjust=self._autoscale_settings,
        )
        self._fixed = self._fixed_replicas()
        self._profiled: dict[tuple[int, AutoscaleSettings], AutoscaleSettings] = {}
        """Per (model, system settings): the settings with the monitor's profiled bounds."""

    def _fixed_replicas(self) -> dict[int, int]:
        """Model index -> groups held fixed (`SimSettings.model_replicas`)."""
        index = {slot.name: m for m, slot in enumerate(self.world.models)}
        unknown = [n for n, _ in self.settings.model_replicas if n not in index]
        if unknown:
            raise SurgeError(f"model_replicas names models not in the run: {unknown}")
        return {index[n]: count for n, count in self.settings.model_replicas}

    def _autoscale_settings(self, pool: Pool, base: AutoscaleSettings) -> AutoscaleSettings:
        """The autoscaler's settings for `pool`: the load monitor's bounds profiled for its
        model (BlitzScale §5.3, `policy.blitzscale.monitor.profiled`, when the system asks),
        FlexPipe's per-group target, a P/D pool's floor of one instance per role while it
        serves (`policy.blitzscale.pd.serving_floor`), and a fixed count where the model's
        share of the cluster is fixed (`model_replicas`)."""
        if base.profile_bounds:
            key = (pool.model, base)
            if key not in self._profiled:
                self._profiled[key] = profiled(
                    base, self._instance_costs(pool.model), self._slo(pool.model)
                )
            base = self._profiled[key]
        settings = self.flexpipe.autoscale_settings(pool, base)
        if pool.pd is not None:  # BlitzScale §2.1, §4: a prefill and a decode instance
            settings = serving_floor(settings)
        fixed = self._fixed.get(pool.model)
        if fixed is None:
            return settings
        return dataclasses.replace(settings, min_replicas=fixed, max_replicas=fixed)

    def _instance_costs(self, model: int) -> InstanceCosts:
        """One instance of `model` as profiled offline: its cost model on its GPUs and the
        engine's step limits."""
        slot = self.world.models[model]
        limits = self.settings
        return monitor_costs(
            slot.profile, slot.group.gpu, slot.tp, limits.max_prefill_tokens, limits.max_batch
        )

    def _slo(self, model: int) -> Slo:
        return self.settings.slo_of(self.world.models[model].name)

    def _num_blocks(self, model: int, num_nodes: int, num_sources: int) -> int:
        """B of one multicast: the system's, or λScale §4.2's elbow (`block_count`)."""
        sys = self.system
        if self.settings.block_count != "elbow":
            return sys.num_blocks
        key = (model, num_nodes, num_sources)
        if key not in self._elbows:
            self._elbows[key] = self._elbow(model, num_nodes, num_sources)
        return self._elbows[key]

    def _elbow(self, model: int, num_nodes: int, num_sources: int) -> int:
        sys, slot = self.system, self.world.models[model]
        prof = slot.profile
        first = next(m for m in self.world.state.machines if m.group is slot.group)
        gbps = self.world.state.network_gbps(first.first_gpu)
        choice = choose_block_count(
            BlockCountSettings(
                model_bytes=prof.total_bytes,
                num_nodes=num_nodes,
                num_sources=num_sources,
                max_blocks=min(64, prof.num_layers),
                strategy=sys.multicast_strategy,
                cluster=Cluster.uniform(num_nodes, gbps),
                transfer_overhead_s=self.settings.block_overhead_s,
            )
        )
        return choice.num_blocks

    def _requests(self, trace: Trace) -> list[SimRequest]:
        nm = len(self.world.models)
        res = self.world.result
        index = trace.model_index % nm
        ins, outs = trace.input_tokens.copy(), trace.output_tokens.copy()
        clipped = 0
        for m, slot in enumerate(self.world.models):
            mask = index == m
            if not mask.any():
                continue
            sub, c = clip_to_context(trace.take(mask), slot.profile.context_tokens)
            ins[mask], outs[mask] = sub.input_tokens, sub.output_tokens
            clipped += c
        res.clipped_requests = clipped
        res.arrival_s = trace.arrival_s.copy()
        res.output_tokens = outs
        res.model_index = index.astype(np.int64)
        return [
            SimRequest(i, int(index[i]), float(trace.arrival_s[i]), int(ins[i]), int(outs[i]))
            for i in range(trace.num_requests)
        ]

    # --- run ----------------------------------------------------------------------
    def run(self, on_progress: Callable[[float], None] | None = None) -> SimResult:
        """Simulate every request; return the result."""
        start = time.perf_counter()
        loop = self.world.loop
        self._schedule_arrivals()
        if self.settings.warm_instances:
            for pool in self.pools.values():
                self.scaler.scale_out(pool, self.settings.warm_instances, warm=True)
                self.flexpipe.adopt_warm(pool)
        for pool in self.pools.values():
            if pool.model in self._fixed:  # a fixed share loads before any arrival
                loop.schedule(0.0, Priority.CONTROL, 0, lambda p=pool: self.scaler.autoscale(p))
        loop.schedule(0.0, Priority.SAMPLE, 0, self._sample)
        last = self.requests[-1].arrival_s if self.requests else 0.0
        loop.run(last + self.settings.max_drain_s, on_progress)
        res = self.world.result
        res.first_token_s = np.array([r.first_token_s for r in self.requests])
        res.done_s = np.array([r.done_s for r in self.requests])
        res.dispatched_s = np.array([r.dispatched_s for r in self.requests])
        res.endpoint = np.array([r.endpoint for r in self.requests], dtype=np.int64)
        res.decode_instance = np.array([r.decode_instance for r in self.requests], np.int64)
        res.handoffs = handoffs_of(self.requests)
        res.end_s = max(loop.now_s, last)
        res.num_events = loop.num_events
        res.wall_s = time.perf_counter() - start
        return res

    def _schedule_arrivals(self) -> None:
        """Arrivals as a chain: each schedules the next, so the heap holds one arrival
        instead of the whole trace (every heap operation stays O(log of the events in
        flight)). The order is the one all-at-once scheduling gives: (time, id), an arrival
        always in the heap before anything that runs after it."""
        loop, arrive, arrival = self.world.loop, self.router.arrive, Priority.ARRIVAL
        order = sorted(self.requests, key=lambda r: (max(r.arrival_s, 0.0), r.id))

        def chain(i: int) -> None:
            req = order[i]
            if i + 1 < len(order):
                nxt = order[i + 1]
                loop.schedule(nxt.arrival_s, arrival, nxt.id, lambda: chain(i + 1))
            arrive(req)

        if order:
            loop.schedule(order[0].arrival_s, Priority.ARRIVAL, order[0].id, lambda: chain(0))

    def _sample(self) -> None:
        loop = self.world.loop
        self.world.result.samples.append(
            (loop.now_s, self.gpus.allocated, self.world.state.host_cache_bytes())
        )
        self.cache.expire()
        if self.router.unfinished:
            loop.schedule(
                loop.now_s + self.settings.sample_interval_s, Priority.SAMPLE, 0, self._sample
            )


def simulate(
    trace: Trace,
    settings: SimSettings,
    on_progress: Callable[[float], None] | None = None,
    system: SystemConfig | None = None,
    host: HostFactory | None = None,
) -> SimResult:
    """Run `settings.system` (or the given `system` variant) on `trace` (on `host`'s
    machines: `Simulation`)."""
    return Simulation(trace, settings, system, host=host).run(on_progress)
