"""The controller: lifecycle, the event pump, and the narrow facade the HTTP API uses.

What flows: at `start`, agents are launched (`LocalCluster`, `RayCluster`) or running ones
are joined (`launching.py`), and the collaborators are wired with what they need passed in:
- `deployments.py`: create / delete / restore after a restart / teardown / describe;
- `requests.py`: submit to a deployment's router, metrics and aborts when done;
- `admission.py`: the hold queue's bound (429) at submit and its timeout (503), checked
  every tick by `_hold_loop` (`policy.admission`);
- `autoscaler.py`: the tick (observe -> `policy.autoscale` -> `policy.placement` -> the
  runtime's scale-out; releases);
- `copies.py`: host copies, GPU-slot release, the pinned-copy invariant
  (`policy.copies.host_copies`, `policy.copies.keepalive`).
The event pump takes the agents' typed events (`BlockArrived` into the parameter pool,
`AgentDown`: its copies and instances are gone). Every decision is `surge.policy`'s; this
file and its collaborators carry decisions out. `surge/api/app.py` and `surge serve` use
only the facade below. Owned by control/.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from surge.config import EngineConfig
from surge.control import admission
from surge.control.adoption import Adopter
from surge.control.autoscale_memory import FILE_NAME, AutoscaleMemory
from surge.control.autoscaler import Autoscaler
from surge.control.copies import Copies
from surge.control.deployments import Deployments
from surge.control.emulation import (
    EmulationCounts,
    control_clock,
    deployment_profile,
    serving_estimates,
)
from surge.control.healing import NodeHealer
from surge.control.launching import AgentCluster, agent_pids, launch_cluster
from surge.control.metrics import Metrics
from surge.control.pool import ParameterPool
from surge.control.requests import Requests
from surge.control.settings import ControllerConfig
from surge.control.spec import DeploymentSpec
from surge.control.state import Deployment, TrackedRequest
from surge.control.store import DeploymentStore
from surge.control.timeline import deployment_up, request_done, snapshot
from surge.engine.prompt_limits import context_limit
from surge.engine.sampling import SamplingParams
from surge.errors import NotFound, SurgeError
from surge.events import BlockLanded, DeploymentGone, EventBus, TimelineEvent
from surge.policy.admission import check_min_replicas
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.multicast.topology import NodeLinks
from surge.policy.versions import same_version
from surge.runtime.client import ClusterClient
from surge.runtime.protocol import AgentDown, BlockArrived, Event, LinkReport, SetPeersOp

__all__ = ["Controller", "ControllerConfig", "Deployment", "TrackedRequest"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Wiring:
    """The collaborators, built once the agents are connected."""

    client: ClusterClient
    store: DeploymentStore
    copies: Copies
    deployments: Deployments
    requests: Requests
    autoscaler: Autoscaler
    healer: NodeHealer
    memory: AutoscaleMemory


class Controller:
    """Owns the agents' client, the deployments and the autoscaler loop."""

    def __init__(
        self,
        config: ControllerConfig,
        addresses: dict[int, tuple[str, int]] | None = None,
        token: str | None = None,
    ) -> None:
        """With `addresses` and `token`, use running agents; else launch them at `start`."""
        self.config = config
        self.addresses = addresses
        self.token = token
        self.cluster: AgentCluster | None = None
        self.pool = ParameterPool()
        self.metrics = Metrics()
        self.events = EventBus()
        """What happens, as typed events (`surge/events.py`): the dashboard subscribes."""
        self.deployments: dict[str, Deployment] = {}
        """Deployments by name (shared with the collaborators)."""
        self.engine = EngineConfig(
            max_num_seqs=config.max_num_seqs,
            fuse_projections=config.fuse_projections,
            compile_decode=config.compile_decode,
            compile_quiet_s=config.compile_quiet_s,
            compile_defer_max_s=config.compile_defer_max_s,
        )
        self.nodes: list[int] = []
        self.links: dict[int, NodeLinks] = {}
        """Each agent's links as it reported them at start (caps, host group): the
        multicast planner's topology (`policy.multicast.topology`)."""
        self.clock = control_clock(config.emulation)
        """The control plane's clock (`runtime/clock.py`; emulated under `emulation`)."""
        self.started_s = self.clock.now_s()
        self._wiring: _Wiring | None = None
        self._tasks: list[asyncio.Task] = []
        self.stopping = False
        """`stop` has begun: agents going away are expected, not warned about."""
        self.emulation_counts = EmulationCounts()

    # ---- lifecycle ---------------------------------------------------------------

    @property
    def registry(self) -> Path:
        """The model registry the agents read (`registry/<deployment name>`)."""
        return self.config.state_dir / "registry"

    @property
    def _w(self) -> _Wiring:
        if self._wiring is None:
            raise SurgeError("the controller is not started: call `await controller.start()`")
        return self._wiring

    @property
    def client(self) -> ClusterClient:
        """The agents' client (tests and tools subscribe to agent events through it)."""
        return self._w.client

    async def start(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        self.registry.mkdir(parents=True, exist_ok=True)
        store = DeploymentStore(self.config.state_dir / "deployments.sqlite")
        if self.addresses is None:
            self.cluster = launch_cluster(self.config, self.registry)
            try:
                await asyncio.to_thread(self.cluster.start)
            except BaseException:
                await asyncio.to_thread(self.cluster.stop)
                raise
            self.addresses, self.token = self.cluster.addresses, self.cluster.token
        if self.token is None:
            raise SurgeError("running agents need their cluster token (Controller(token=...))")
        tls = self.config.tls.load() if self.config.tls is not None else None
        client = ClusterClient(self.addresses, self.token, tls, self.config.stall_timeout_s)
        await client.connect()
        hello = await client.broadcast(SetPeersOp(peers=dict(self.addresses)))
        self.links.update({n: LinkReport.planned(r.links) for n, r in hello.items()})
        self.nodes = sorted(self.addresses)
        self._wiring = self._wire(client, store)
        events = client.subscribe((BlockArrived, AgentDown))
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._pump(events)))
        await self._w.deployments.restore_all()
        self._w.memory.restore(self.deployments)  # before the first tick decides
        self._w.deployments.adopter.settle(self.deployments)  # idle since the carried time
        self._tasks.append(loop.create_task(self._w.autoscaler.run()))
        self._tasks.append(loop.create_task(self._w.memory.run(self.deployments)))
        self._tasks.append(loop.create_task(self._hold_loop()))
        self._tasks.append(loop.create_task(self._w.healer.heartbeat()))

    async def _hold_loop(self) -> None:
        """Every tick: end the requests held past their deployment's hold timeout (503)."""
        while True:
            await self.clock.sleep(self.config.tick_s)
            now_s = self.clock.now_s()
            for dep in list(self.deployments.values()):
                try:
                    admission.expire(dep, now_s, self.metrics)
                except Exception:  # a bug must not stop the timeouts of every model
                    log.exception("%s: hold timeout check failed", dep.name)

    def _wire(self, client: ClusterClient, store: DeploymentStore) -> _Wiring:
        copies = Copies(
            client, self.pool, self.deployments, self.config, self.live_nodes, self.started_s,
            self.clock,
        )  # fmt: skip
        autoscaler = Autoscaler(
            client,
            self.pool,
            self.metrics,
            self.config,
            self.engine,
            self.deployments,
            copies,
            self.live_nodes,
            events=self.events,
            links=self.links,
            clock=self.clock,
            estimates=serving_estimates(self.config.emulation),
        )
        adopter = Adopter(
            client, copies, self.config.slots_per_node, self.engine, self.clock,
            autoscaler.pd.attach,
        )  # fmt: skip
        deployments = Deployments(
            client,
            self.pool,
            self.metrics,
            store,
            self.registry,
            self.deployments,
            copies,
            self.live_nodes,
            adopter,
            self.clock,
        )
        requests = Requests(client, self.deployments, self.metrics, autoscaler.wake)
        deployments.check_capacity = self._check_capacity
        deployments.step_profile = partial(deployment_profile, self.config, self.engine)
        copies.load_failed = autoscaler.load_failed = deployments.load_failed
        healer = NodeHealer(client, self.cluster, self.config, self.deployments, self.pool,
                            self.links, lambda: self.stopping)  # fmt: skip
        memory = AutoscaleMemory(self.config.state_dir / FILE_NAME, self.clock)
        return _Wiring(client, store, copies, deployments, requests, autoscaler, healer, memory)

    async def stop(self) -> None:
        """Stop the loops and forget the deployments (agents keep their copies); stop the
        agents this controller launched."""
        self.stopping = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        w = self._wiring
        if w is not None:
            await w.healer.close()
            await w.memory.save(self.deployments)  # what a restart carries: as of now
            for dep in list(self.deployments.values()):
                await w.deployments.teardown(dep, evict=False)
            await w.client.close()
            w.store.close()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop)

    async def refresh_metrics(self) -> None:
        """Bring the metrics that live on the agents up to date (before a scrape): under
        GPU-time emulation, each node's paced steps and violations."""
        if self.config.emulation is not None and self._wiring is not None:
            await self.emulation_counts.refresh(self.metrics, self.client, self.live_nodes())

    def live_nodes(self) -> list[int]:
        """Nodes whose agent is up, ascending."""
        down = self._wiring.client.down if self._wiring else set()
        return [n for n in self.nodes if n not in down]

    # ---- events ------------------------------------------------------------------

    async def _pump(self, events: asyncio.Queue[Event]) -> None:
        while True:
            ev = await events.get()
            if isinstance(ev, BlockArrived):
                dep = self.deployments.get(ev.model)
                if dep is None or not same_version(ev.digest, dep.manifest.digest):
                    continue  # another version's block is no copy of the deployment's
                if ev.source == "mate" and ev.src is not None:  # a mate's device copy
                    self.pool.add_shared(ev.model, ev.node, ev.src, (ev.block,))
                else:
                    self.pool.add(ev.model, ev.node, ev.tier, (ev.block,))
                size = dep.manifest.blocks[ev.block].size_bytes
                self.metrics.bytes_moved.labels(ev.model, ev.tier).inc(size)
                self.events.publish(
                    BlockLanded(model=ev.model, node=ev.node, block=ev.block, tier=ev.tier)
                )
            elif isinstance(ev, AgentDown):
                (log.info if self.stopping else log.warning)("node %d is down", ev.node)
                self._w.copies.node_down(ev.node)
                for dep in self.deployments.values():
                    dep.instances.pop(ev.node, None)
                self._w.healer.node_down(ev.node)  # a replacement, if the launcher can

    # ---- the facade the API uses -------------------------------------------------

    async def create(self, body: Any) -> Deployment:
        """A new deployment from its JSON spec (`DeploymentSpec.from_json`)."""
        dep = await self._w.deployments.create(body)
        self.events.publish(deployment_up(dep))
        return dep

    async def delete(self, name: str) -> None:
        """Delete a deployment (`NotFound` if there is none): instances and copies go."""
        await self._w.deployments.delete(name)
        await self._w.memory.save(self.deployments)  # its carry goes with it
        self.events.publish(DeploymentGone(model=name))

    def describe(self, dep: Deployment) -> dict[str, Any]:
        return self._w.deployments.describe(dep)

    def deployment(self, name: str) -> Deployment:
        """The deployment serving `name`: `NotFound` (404) if there is none, `Unavailable`
        (503, with the reason) if it has failed (its store is missing or damaged)."""
        return self._w.deployments.lookup(name)

    def describe_all(self) -> list[dict[str, Any]]:
        """Every deployment as the admin API lists it, failed ones included (their
        `status.state` is "failed" and `status.failure` says why)."""
        w = self._w.deployments
        return [w.describe(d) for d in self.deployments.values()] + [
            w.describe_failed(f) for f in w.failed.values()
        ]

    def describe_named(self, name: str) -> dict[str, Any]:
        """One deployment as `describe_all` shows it (`NotFound` if there is none)."""
        w = self._w.deployments
        if name in w.failed:
            return w.describe_failed(w.failed[name])
        dep = self.deployments.get(name)
        if dep is None:
            raise NotFound(f"no deployment {name!r}")
        return w.describe(dep)

    def _check_capacity(self, spec: DeploymentSpec) -> None:
        """Refuse a `min_replicas` the cluster can never hold (`policy.admission`)."""
        check_min_replicas(
            spec.autoscaling.min_replicas, len(self.nodes), self.config.slots_per_node
        )

    def autoscale_settings(self, dep: Deployment) -> AutoscaleSettings:
        """The knobs `dep` is scaled by now: its load monitor's bounds among them (BlitzScale
        §5.3: from its engine's step profile once it has one, `dep.step_profile`, else the
        host's estimates)."""
        return self._w.autoscaler.settings(dep)

    def context_limit(self, dep: Deployment) -> int:
        """Most tokens (prompt + output) one request of `dep` may hold."""
        return context_limit(dep.manifest.arch, self.engine)

    async def submit(
        self, dep: Deployment, prompt_token_ids: list[int], params: SamplingParams
    ) -> TrackedRequest:
        return await self._w.requests.submit(dep, prompt_token_ids, params)

    def finished(self, req: TrackedRequest, status: str = "ok") -> None:
        """The API is done with `req`: record its metrics, abort it if it still runs."""
        self._w.requests.finished(req, status)
        if self.events.active:  # the serving path: nothing is built when nobody listens
            self.events.publish(request_done(req))

    def timeline_now(self) -> list[TimelineEvent]:
        """What holds now as timeline events (a dashboard's first picture)."""
        return snapshot(self.nodes, self.deployments, self.pool, self.events.t0)

    def nodes_view(self) -> list[dict[str, Any]]:
        """The agents as the admin API shows them."""
        down = self._wiring.client.down if self._wiring else set()
        pids = agent_pids(self.cluster)
        return [
            {
                "node": n,
                "address": list(self.addresses[n]) if self.addresses else None,
                "up": n not in down,
                "pid": pids.get(n),
                "instances": [d.name for d in self.deployments.values() if n in d.instances],
            }
            for n in self.nodes
        ]
