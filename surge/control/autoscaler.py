"""The autoscaler tick: observe each deployment, let `surge.policy` decide, carry it out.

What flows, every `tick_s` (and at once when a request reaches a model at zero), per
deployment: its instances' load (outstanding requests, loading or not, idle since when,
tokens/s and KV use from `load_monitor.py`)
-> `policy.autoscale.decide` (state kept in `Deployment.autoscale_state`) -> for a
scale-out, destinations by `policy.placement.place` (host copies first where
`policy.placement.prefers_host_copy` says so, then the least busy NICs) ->
`start_scale_out` (the runtime brings them up by the deployment's strategy);
for a release, the instance is retired from the router and its slot released
(`copies.py`). After the deployments, the pinned-copy invariant and host-copy expiry
(`copies.py`, by `policy.copies.host_copies`). Prometheus gauges are set from what it observed.
Dependencies are passed in by `control/controller.py`. Owned by control/.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable

from surge.config import EngineConfig
from surge.control.adoption import failed_pipeline_nodes
from surge.control.copies import Copies
from surge.control.emulation import instance_costs, monitor_kv_tokens
from surge.control.flexpipe import FlexPipeControl, flexpipe_autoscale
from surge.control.load_monitor import LoadMonitor, pool_load
from surge.control.metrics import Metrics
from surge.control.pd import PdControl, disaggregated
from surge.control.pool import ParameterPool
from surge.control.scaleout_side import DeploymentSide
from surge.control.scaleouts import (
    ScaleOutOffer,
    first_endpoint_s,
    start_scale_out,
)
from surge.control.settings import ControllerConfig
from surge.control.state import Deployment, Instance
from surge.events import (
    NO_BUS,
    EventBus,
    InstanceDrained,
    InstanceUp,
    Load,
    ScaleOutDone,
    ScaleOutStarted,
)
from surge.policy.autoscale import decide
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.blitzscale.monitor import profiled
from surge.policy.blitzscale.pd import serving_floor, with_monitor
from surge.policy.flexpipe.hrg import ScalingMark
from surge.policy.multicast.topology import NodeLinks
from surge.policy.placement import MachineView, PlacementRequest, place, prefers_host_copy
from surge.runtime.client import ClusterClient
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.scaleout import ScaleOutReport
from surge.runtime.scaleout.estimates import HOST_ESTIMATES, ServingEstimates

log = logging.getLogger(__name__)


class Autoscaler:
    """The tick loop over the controller's deployments."""

    def __init__(
        self,
        client: ClusterClient,
        pool: ParameterPool,
        metrics: Metrics,
        config: ControllerConfig,
        engine: EngineConfig,
        deployments: dict[str, Deployment],
        copies: Copies,
        live_nodes: Callable[[], list[int]],
        load_failed: Callable[[Deployment, Exception], Awaitable[None]] | None = None,
        events: EventBus = NO_BUS,
        links: dict[int, NodeLinks] | None = None,
        clock: Clock = REAL_CLOCK,
        estimates: ServingEstimates = HOST_ESTIMATES,
    ) -> None:
        self.client, self.pool, self.metrics = client, pool, metrics
        self.estimates = estimates
        """Compute and fetch rates the scale-outs assume before measuring
        (`control/emulation.serving_estimates`)."""
        self.clock = clock
        """The control plane's clock (`runtime/clock.py`): its tick, every window and
        keep-alive it decides by, in emulated seconds under GPU-time emulation."""
        self.config, self.engine, self.deployments = config, engine, deployments
        self.copies, self.live_nodes = copies, live_nodes
        self.load_failed = load_failed
        """Told of a failed scale-out (it checks the store; a bad one fails the deployment)."""
        self.nic_load: dict[int, int] = {}
        """Scale-outs each node's NIC takes part in now (placement spreads over NICs)."""
        self._wake = asyncio.Event()
        self.links = links if links is not None else {}
        """Each agent's reported links (the multicast planner's topology, FlexPipe's HRG)."""
        self.scaling_marks: list[ScalingMark] = []
        """FlexPipe §7's HRG markers: servers new groups and refactorings loaded onto."""
        self.flexpipe = FlexPipeControl(
            client, pool, metrics, copies, live_nodes, self.free_slots, config.link_gbps, events,
            clock, estimates, self.links, self.scaling_marks,
        )  # fmt: skip
        """FlexPipe's granularity loop (refactors live pipelines; `control/flexpipe.py`)."""
        self.events = events
        """The dashboard's stream: scale-outs, instances up and drained, load per tick."""
        self.pd = PdControl(metrics, engine, events, self.links, config.emulation)
        self.monitor = LoadMonitor()
        """Tokens/s per instance (BlitzScale's load monitor, `control/load_monitor.py`)."""
        self.kv_tokens = monitor_kv_tokens(config.emulation, engine)
        """One instance's KV tokens, the monitor's KV use is measured against
        (`control/emulation.monitor_kv_tokens`: the emulated GPU's under emulation)."""
        self._profiled: dict[tuple, AutoscaleSettings] = {}
        """The monitor's bounds profiled once per deployment's settings, SLO, model size and
        step profile (§5.3: "offline"), not again at every tick; as the simulator keeps them."""

    def wake(self) -> None:
        """Tick now instead of at the end of the period (a request reached a model at zero)."""
        self._wake.set()

    async def run(self) -> None:
        """Tick every `tick_s` (of the clock) until cancelled; a failing tick is logged,
        not fatal."""
        last_s = self.clock.now_s()
        while True:
            await self.clock.wait(self._wake, self.config.tick_s)
            self._wake.clear()
            now_s = self.clock.now_s()
            dt_s, last_s = now_s - last_s, now_s
            try:
                await self.tick(now_s, dt_s)
            except Exception:  # a bug must not stop autoscaling for every model
                log.exception("autoscaler tick failed")

    async def tick(self, now_s: float, dt_s: float) -> None:
        self.metrics.nodes_up.set(len(self.live_nodes()))
        serving = {i.endpoint.name for d in self.deployments.values() for i in d.serving()}
        self.monitor.forget(serving)
        for dep in list(self.deployments.values()):
            if dep.failure is not None:
                continue
            for node in failed_pipeline_nodes(dep):  # an adopted pipeline that failed
                await self.release(dep, node)
            self._observe(dep, now_s, dt_s)
            await self._autoscale(dep, now_s, await self.pd.tick(dep, now_s))
            await self.flexpipe.tick(dep, now_s)
            if not dep.restoring and not self.copies.invariant_holds(dep):
                await self.copies.restore_invariant(dep)
        self.copies.expire(now_s)

    def settings(self, dep: Deployment) -> AutoscaleSettings:
        """The deployment's knobs within the cluster's instance slots: the load monitor's
        bounds profiled for its model when the strategy asks (BlitzScale §5.3,
        `policy.blitzscale.monitor.profiled` of `control/emulation.instance_costs`: its
        engine's step profile where one was taken, and the deployment's SLO), a FlexPipe
        pipeline's target scaled by its stages (`control/flexpipe.py`), a P/D deployment's
        floor of one instance per role while it serves (`policy.blitzscale.pd.serving_floor`,
        as `control/pd.py` attaches P/D)."""
        slots = len(self.live_nodes()) * self.config.slots_per_node
        base = dep.spec.autoscaling
        if base.profile_bounds:
            slo, size = dep.spec.slo.seconds(), dep.manifest.total_bytes
            key = (base, slo, size, dep.step_profile)
            if key not in self._profiled:
                costs = instance_costs(
                    self.config.emulation, self.estimates, size, self.engine, dep.step_profile
                )
                self._profiled[key] = profiled(base, costs, slo)
            base = self._profiled[key]
        settings = flexpipe_autoscale(dep, base.capped(slots))
        if disaggregated(dep):
            settings = serving_floor(settings)  # BlitzScale §2.1, §4
        return settings

    def _observe(self, dep: Deployment, now_s: float, dt_s: float) -> None:
        m, name = self.metrics, dep.name
        for inst in dep.instances.values():
            ep = inst.endpoint
            if ep is not None:
                self.monitor.observe(ep, now_s)
            if ep is None or ep.outstanding > 0:
                inst.idle_since_s = None
            elif inst.idle_since_s is None:
                inst.idle_since_s = now_s
            if ep is not None:  # a serving instance keeps its node's host copy in use
                dep.host_last_used_s[inst.node] = now_s
        serving = len(dep.serving())
        queued = len(dep.server.queue)
        m.queue.labels(name).set(queued)
        m.ongoing.labels(name).set(len(dep.requests))
        waiting = {id(r) for r in dep.server.queue}
        running = [r for r in dep.requests.values() if not r.done.is_set() and id(r) not in waiting]
        m.vllm_running.labels(name).set(len(running))
        m.vllm_waiting.labels(name).set(queued)
        # Approximate: tokens held by running requests over the serving instances' KV
        # capacity (the agents do not report their page tables).
        kv_tokens = sum(len(r.prompt_token_ids) + len(r.output_token_ids) for r in running)
        capacity = serving * self.kv_tokens
        m.vllm_kv_usage.labels(name).set(min(1.0, kv_tokens / capacity) if capacity else 0.0)
        m.instances.labels(name).set(serving)
        m.loading.labels(name).set(len(dep.instances) - serving)
        m.pipelines.labels(name).set(dep.num_pipelines())
        if dep.instances:
            m.gpu_seconds.labels(name).inc(len(dep.instances) * dt_s)
        if self.events.active:
            load = Load(
                model=name,
                queued=queued,
                ongoing=len(dep.requests),
                instances=serving,
                loading=len(dep.instances) - serving,
                pipelines=dep.num_pipelines(),
            )
            self.events.publish(load)

    async def _autoscale(self, dep: Deployment, now_s: float, monitor_wants: int = 0) -> None:
        """One decision of `surge.policy.autoscale` for the deployment, carried out; the
        P/D monitor (`control/pd.py`) may ask for one more when nothing loads."""
        settings = self.settings(dep)
        load = pool_load(dep, now_s, self.monitor, self.kv_tokens)
        decision = decide(load, settings, dep.autoscale_state)
        dep.autoscale_state = decision.state
        room = settings.max_replicas is None or len(dep.instances) < settings.max_replicas
        all_serving = len(dep.serving()) == len(dep.instances)
        scale_out = with_monitor(decision.scale_out, monitor_wants, all_serving, room)
        if scale_out > 0:
            added = self._scale_out(dep, scale_out)
            await self.pd.on_scale_out(dep, now_s, added)  # §5.2 mutation
        for node in self.pd.releasable(dep, decision.release):  # P/D keeps both roles
            await self.release(dep, node)

    def free_slots(self, node: int) -> int:
        used = sum(node in d.instances for d in self.deployments.values())
        return self.config.slots_per_node - used

    def _scale_out(self, dep: Deployment, count: int) -> int:
        """Place `count` new instances by `policy.placement` and start their scale-out;
        how many it placed."""
        t0_s = self.clock.now_s()
        hosts = set(self.pool.complete(dep.name, "host"))
        slots = self.config.slots_per_node
        machines = [
            MachineView(
                machine=n,
                # Global slot ids (node * slots + i), so a placed id names its node.
                free_gpus=tuple(n * slots + i for i in range(max(0, self.free_slots(n)))),
                has_host_copy=n in hosts,
                nic_load=self.nic_load.get(n, 0),
            )
            for n in self.live_nodes()
            if n not in dep.instances
        ]
        request = PlacementRequest(
            gpus_per_instance=1,
            num_instances=count,
            prefer_host_copy=prefers_host_copy(dep.spec.system),
        )
        placed = place(machines, request)
        dests = [gpus[0] // slots for gpus in placed]
        if not dests:
            return 0
        for d in dests:
            dep.instances[d] = Instance(d)
            self.nic_load[d] = self.nic_load.get(d, 0) + 1
        # Pipelines are named by plan index in the runtime: one serve-while-loading
        # multicast per model at a time; the others load, then serve.
        owns_multicast = not dep.multicasting
        dep.multicasting = True
        dep.num_scale_outs += 1
        self.events.publish(ScaleOutStarted(model=dep.name, nodes=tuple(dests)))
        placement_s = self.clock.now_s() - t0_s
        dep.spawn(self._run_scale_out(dep, dests, owns_multicast, placement_s))
        return len(dests)

    def offer(self, dep: Deployment, dests: list[int], booked: list[int]) -> ScaleOutOffer:
        """What a scale-out of `dep` to `dests` is offered (`control/scaleouts.start_scale_out`):
        the controller's side of it, the spare nodes and NIC load now, and whether new
        instances wait for their engine start (under GPU-time emulation only)."""
        return ScaleOutOffer(
            side=DeploymentSide(dep, self, booked),
            spares=tuple(
                n
                for n in self.live_nodes()
                if n not in dests and n not in dep.instances and self.free_slots(n) > 0
            ),
            nic_load={n: k for n, k in self.nic_load.items() if k > 0 and n not in dests},
            link_gbps=self.config.link_gbps,
            events=self.events,
            links=self.links,
            estimates=self.estimates,
            paced_setups=self.config.emulation is not None,
            group_block_bound=self.config.group_block_bound,
        )

    async def _run_scale_out(
        self, dep: Deployment, dests: list[int], owns_multicast: bool, placement_s: float = 0.0
    ) -> None:
        """One scale-out and its bookkeeping (metrics and phases, NIC load, slots that never
        came up); a failure is handed to `load_failed` (a damaged store fails the model)."""
        name, m = dep.name, self.metrics
        in_flight = len(dests) * dep.manifest.num_blocks
        m.blocks_in_flight.labels(name).inc(in_flight)
        report = ScaleOutReport()
        booked: list[int] = []  # spare slots the scale-out took (ParaServe group members)
        t0_s = self.clock.now_s()
        first = asyncio.get_running_loop().create_task(first_endpoint_s(dep, t0_s))
        try:
            await start_scale_out(
                self.client,
                self.pool,
                dep,
                dests,
                self.offer(dep, dests, booked),
                engine=self.engine,
                timeout_s=self.clock.real_s(self.config.scale_out_timeout_s),
                serve_while_loading=owns_multicast,
                report=report,
            )
            kind = report.kind or "unknown"
            dep.last_start = kind
            m.scale_outs.labels(name, kind).inc()
            load_s = self.clock.now_s() - t0_s
            log.info("%s: %s scale-out to %s in %.2f s", name, kind, dests, load_s)
            self.events.publish(
                ScaleOutDone(
                    model=name,
                    nodes=tuple(dests),
                    kind=kind,
                    load_s=load_s,
                    sources=report.sources,
                )
            )
            phase = m.scale_out_phase
            phase.labels(name, kind, "placement").observe(placement_s)
            phase.labels(name, kind, "load").observe(load_s)
            first_s = first.result() if first.done() else None
            phase.labels(name, kind, "first_endpoint").observe(first_s or load_s)
        except Exception as e:
            load_s = self.clock.now_s() - t0_s
            self.events.publish(
                ScaleOutDone(model=name, nodes=tuple(dests), kind="failed", load_s=load_s)
            )
            if self.load_failed is not None:
                await self.load_failed(dep, e)
            if dep.failure is None:
                log.warning("%s: scale-out to %s failed: %s", name, dests, e)
        finally:
            first.cancel()
            if owns_multicast:
                dep.multicasting = False
            m.kv_migrated.labels(name).inc(report.kv_migrated)
            m.live_prefilled.labels(name).inc(report.live_prefilled)
            m.consolidations.labels(name).inc(report.consolidated)
            m.pipelines_opened.labels(name).inc(report.pipelines_opened)
            dep.num_kv_migrated += report.kv_migrated
            dep.num_live_prefilled += report.live_prefilled
            m.blocks_in_flight.labels(name).dec(in_flight)
            for d in [*dests, *booked]:
                self.nic_load[d] = max(0, self.nic_load.get(d, 0) - 1)
                inst = dep.instances.get(d)
                if inst is not None and inst.endpoint is None:  # never came up
                    dep.instances.pop(d, None)
                    await self.copies.release_slot(name, d, dep.manifest.num_blocks)

    async def on_local(self, dep: Deployment, node: int, ep: LocalEndpoint) -> None:
        """A destination serves as a local instance (called by the scale-out)."""
        inst = dep.instances.get(node)
        if inst is None or dep.name not in self.deployments:  # released or deleted meanwhile
            await dep.server.retire(ep.name)
            await self.copies.release_slot(dep.name, node, dep.manifest.num_blocks)
            return
        inst.endpoint = ep
        inst.idle_since_s = None
        self.events.publish(InstanceUp(model=dep.name, node=node, name=ep.name))
        dep.host_last_used_s[node] = self.clock.now_s()

    async def release(self, dep: Deployment, node: int) -> None:
        """Retire the deployment's instance on `node` and free its slot."""
        inst = dep.instances.pop(node, None)
        if inst is None:
            return
        if inst.endpoint is not None:
            await dep.server.retire(inst.endpoint.name)
        await self.copies.release_slot(dep.name, node, dep.manifest.num_blocks)
        self.metrics.released.labels(dep.name).inc()
        for other, o in list(dep.instances.items()):  # a FlexPipe pipeline's other members
            if inst.endpoint is not None and o.endpoint is inst.endpoint:
                dep.instances.pop(other, None)
                await self.copies.release_slot(dep.name, other, dep.manifest.num_blocks)
        self.events.publish(InstanceDrained(model=dep.name, node=node))
