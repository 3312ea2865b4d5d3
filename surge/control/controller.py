"""The controller: deployments, the autoscaler loop, routing and the parameter pool.

What flows: deployments come in (API, config, SQLite on restart); each gets a registry entry
(a store, imported from a checkpoint if needed), is registered on every agent and gets one
complete host copy (BlitzScale's invariant). Requests go to the deployment's `Server`, which
queues them while no endpoint exists. Every tick the autoscaler (`surge.policy.autoscale`)
turns the load into a scale decision; placement (`surge.policy.placement`) picks
destinations (host copies first, then the least busy NICs); `control.scaleout` brings them up
by the deployment's strategy; idle instances are released after the delays, the last one after
`keep_alive_s`. Host caches expire and evict by `surge.policy.keepalive` (the pinned copy
never). An agent that dies takes its copies and endpoints with it; its requests are re-run
elsewhere by the server; the pool's invariant is restored on another node.
"""

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from surge.config import EngineConfig
from surge.control.metrics import Metrics
from surge.control.pool import ParameterPool
from surge.control.scaleout import ScaleOutContext, instance_name, run_scale_out
from surge.control.spec import DeploymentSpec
from surge.control.store import DeploymentStore
from surge.engine.llm_engine import context_limit
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError
from surge.model.manifest import MANIFEST_NAME, Manifest, read_manifest
from surge.policy.autoscale import (
    AutoscaleSettings,
    AutoscaleState,
    InstanceLoad,
    PoolLoad,
    decide,
)
from surge.policy.keepalive import CacheEntry, CacheSettings, admit, expired
from surge.policy.placement import MachineView, PlacementRequest, place
from surge.runtime.client import ClusterClient
from surge.runtime.serving import LocalEndpoint, PipelineEndpoint, Server, ServeRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControllerConfig:
    """Settings of the control plane."""

    state_dir: Path
    """Deployments database and the model registry live here."""
    nodes: int = 4
    link_gbps: float | None = None
    slots_per_node: int = 1
    """Instances (of any models) one node runs at once (its GPUs)."""
    host_cache_bytes: int = 4 << 30
    """Host memory of each node given to cached models."""
    host_keep_alive_s: float | None = 600.0
    """An unpinned host copy unused this long is evicted (None: only LRU)."""
    tick_s: float = 0.1
    max_num_seqs: int = 64
    preload_engine: bool = True
    scale_out_timeout_s: float = 120.0
    launcher: str = "local"
    """Where agents run without `addresses`: "local" (processes here) or "ray" (actors)."""
    ray_address: str | None = None
    """With launcher "ray": a running Ray cluster; None starts a local one on loopback."""


class TrackedRequest(ServeRequest):
    """A `ServeRequest` that also wakes a streamer on every token."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.progress = asyncio.Event()
        self.deployment = ""

    def add_token(self, token: int, finished: bool, reason: str | None) -> None:
        super().add_token(token, finished, reason)
        self.progress.set()

    def finish(self, reason: str) -> None:
        """End it from the controller's side (stop string, deletion, client gone)."""
        if not self.done.is_set():
            self.done_t = time.monotonic()
            self.finish_reason = reason
            self.done.set()
            self.progress.set()


@dataclass
class Instance:
    """One slot of a deployment on one node."""

    node: int
    endpoint: LocalEndpoint | None = None
    """None while loading."""
    idle_since: float | None = None
    started: float = field(default_factory=time.monotonic)


@dataclass
class Deployment:
    spec: DeploymentSpec
    manifest: Manifest
    tokenizer: Any
    server: Server
    instances: dict[int, Instance] = field(default_factory=dict)
    requests: dict[str, TrackedRequest] = field(default_factory=dict)
    autoscale_state: AutoscaleState = field(default_factory=AutoscaleState)
    """What `surge.policy.autoscale` remembers between ticks (stable and panic windows)."""
    tasks: set[asyncio.Task] = field(default_factory=set)
    restoring: bool = False
    last_start: str | None = None
    first_token_after_zero_s: float | None = None
    zero_since: float | None = None
    scale_outs: int = 0
    pinned_node: int | None = None
    host_last_used: dict[int, float] = field(default_factory=dict)
    kv_migrated: int = 0
    """Requests moved onto new instances with their KV cache (ParaServe consolidation)."""
    live_prefilled: int = 0
    """Requests prefilled by live scaling (BlitzScale)."""
    multicasting: bool = False
    """A serve-while-loading scale-out of this deployment is running."""

    @property
    def name(self) -> str:
        return self.spec.name

    def serving(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.endpoint is not None]


class Controller:
    """Owns the agents' client, the deployments and the autoscaler loop."""

    def __init__(
        self,
        config: ControllerConfig,
        addresses: dict[int, tuple[str, int]] | None = None,
        token: str | None = None,
    ) -> None:
        """With `addresses` and `token`, use running agents; else start a `LocalCluster`."""
        self.config = config
        self.addresses = addresses
        self.token = token
        self.cluster: Any = None
        self.client: ClusterClient | None = None
        self.store: DeploymentStore | None = None
        self.pool = ParameterPool()
        self.metrics = Metrics()
        self.deployments: dict[str, Deployment] = {}
        self.engine = EngineConfig(max_num_seqs=config.max_num_seqs)
        self.nodes: list[int] = []
        self.nic_load: dict[int, int] = {}
        self._tasks: list[asyncio.Task] = []
        self._lock = asyncio.Lock()
        self._tick_now = asyncio.Event()
        self.started_t = time.monotonic()

    # ---- lifecycle ---------------------------------------------------------------

    @property
    def registry(self) -> Path:
        return self.config.state_dir / "registry"

    async def start(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        self.registry.mkdir(parents=True, exist_ok=True)
        self.store = DeploymentStore(self.config.state_dir / "deployments.sqlite")
        if self.addresses is None:
            self.cluster = self._launcher()
            try:
                await asyncio.to_thread(self.cluster.start)
            except BaseException:
                await asyncio.to_thread(self.cluster.stop)
                raise
            self.addresses, self.token = self.cluster.addresses, self.cluster.token
        assert self.addresses is not None and self.token is not None
        self.client = ClusterClient(self.addresses, self.token)
        await self.client.connect()
        peers = {str(n): list(a) for n, a in self.addresses.items()}
        await self.client.broadcast({"op": "set_peers", "peers": peers})
        self.nodes = sorted(self.addresses)
        self.nic_load = dict.fromkeys(self.nodes, 0)
        self._events = self.client.listen()
        self._tasks.append(asyncio.get_running_loop().create_task(self._pump()))
        for spec in self.store.all():
            try:
                await self._activate(spec)
            except SurgeError as e:
                log.error("deployment %s cannot come back: %s", spec.name, e)
        self._tasks.append(asyncio.get_running_loop().create_task(self._loop()))

    def _launcher(self) -> Any:
        """A `LocalCluster` or a `RayCluster` (same surface) of `config.nodes` agents."""
        c = self.config
        common: dict[str, Any] = {
            "num_nodes": c.nodes,
            "link_gbps": c.link_gbps,
            "remote_dir": self.registry,
            "max_num_seqs": c.max_num_seqs,
            "preload_engine": c.preload_engine,
        }
        if c.launcher == "ray":
            from surge.runtime.launcher_ray import RayCluster, RayClusterConfig

            return RayCluster(RayClusterConfig(address=c.ray_address, **common))
        if c.launcher != "local":
            raise SurgeError(f"launcher {c.launcher!r} is not one of local, ray")
        from surge.runtime.launcher import LocalCluster, LocalClusterConfig

        return LocalCluster(LocalClusterConfig(**common))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for dep in list(self.deployments.values()):
            await self._teardown(dep, evict=False)
        if self.client is not None:
            await self.client.close()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop)
        if self.store is not None:
            self.store.close()

    def live_nodes(self) -> list[int]:
        down = self.client.down if self.client else set()
        return [n for n in self.nodes if n not in down]

    # ---- deployments -------------------------------------------------------------

    async def create(self, body: Any) -> Deployment:
        spec = DeploymentSpec.from_json(body)
        async with self._lock:
            if spec.name in self.deployments:
                raise SurgeError(f"deployment {spec.name!r} already exists")
            assert self.store is not None
            await asyncio.to_thread(self._prepare_store, spec)
            self.store.add(spec)
            try:
                return await self._activate(spec)
            except BaseException:
                self.store.remove(spec.name)
                raise

    async def delete(self, name: str) -> None:
        async with self._lock:
            dep = self.deployments.get(name)
            if dep is None:
                raise KeyError(name)
            await self._teardown(dep, evict=True)
            assert self.store is not None
            self.store.remove(name)
            link = self.registry / name
            if link.is_symlink():
                link.unlink()

    def _prepare_store(self, spec: DeploymentSpec) -> None:
        """Put the model in the registry as `registry/<name>` (link a store, import HF)."""
        target = self.registry / spec.name
        src = Path(spec.model).expanduser()
        if target.is_symlink() or target.exists():
            if target.is_symlink():
                target.unlink()
            else:
                import shutil

                shutil.rmtree(target)
        if (src / MANIFEST_NAME).is_file():
            read_manifest(src)  # a clear error if it is not a valid store
            target.symlink_to(src.resolve(), target_is_directory=True)
        elif (src / "config.json").is_file():
            from surge.model.importer import import_checkpoint

            import_checkpoint(src, target, name=spec.name, progress=False)
        else:
            raise SurgeError(
                f"model {spec.model!r} is neither a surge store (manifest.json) nor a "
                "Hugging Face checkpoint directory (config.json) on the controller's machine"
            )

    async def _activate(self, spec: DeploymentSpec) -> Deployment:
        """Register a stored deployment on every agent and give it its host copy."""
        store = self.registry / spec.name
        if not (store / MANIFEST_NAME).is_file():
            await asyncio.to_thread(self._prepare_store, spec)
        manifest = read_manifest(store)
        tokenizer = None
        if manifest.tokenizer_file and (store / manifest.tokenizer_file).is_file():
            from surge.model.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(store / manifest.tokenizer_file)
        assert self.client is not None
        name = spec.name
        await self.client.broadcast(
            {"op": "register", "model": name, "manifest": manifest.to_json()}, self.live_nodes()
        )
        self.pool.add_model(name, manifest.num_blocks)
        statuses = await self.client.broadcast({"op": "status"}, self.live_nodes())
        for node, st in statuses.items():
            self.pool.load_status(node, st)
        # A new controller adopts no instance of an old one: close them, keep host/disk copies.
        for node in self.pool.complete(name, "gpu") + [
            n for n in self.live_nodes() if self.pool.blocks_at(name, n, "gpu")
        ]:
            await self._release_slot(name, node)
        dep = Deployment(spec, manifest, tokenizer, Server(self.client, name))
        dep.zero_since = time.monotonic()
        hosts = self.pool.complete(name, "host")
        dep.pinned_node = hosts[0] if hosts else None
        self.deployments[name] = dep
        if not hosts:
            await self._restore_invariant(dep)
        return dep

    async def _teardown(self, dep: Deployment, evict: bool) -> None:
        self.deployments.pop(dep.name, None)
        for t in list(dep.tasks):
            t.cancel()
        for req in list(dep.requests.values()):
            req.finish("abort")
        await dep.server.close()
        self.metrics.forget(dep.name)
        if not evict:
            return
        blocks = list(range(dep.manifest.num_blocks))
        for node in self.live_nodes():
            with contextlib.suppress(Exception):
                await self.client.request(  # type: ignore[union-attr]
                    node, {"op": "instance_close", "instance": instance_name(dep.name, node)}
                )
            for tier in ("gpu", "host", "disk"):
                with contextlib.suppress(Exception):
                    await self.client.request(  # type: ignore[union-attr]
                        node, {"op": "evict", "model": dep.name, "tier": tier, "blocks": blocks}
                    )
        self.pool.drop_model(dep.name)

    def describe(self, dep: Deployment) -> dict[str, Any]:
        pipes = sum(isinstance(e, PipelineEndpoint) for e in dep.server.endpoints.values())
        return {
            **dep.spec.to_json(),
            "status": {
                "instances": len(dep.serving()),
                "loading": len(dep.instances) - len(dep.serving()),
                "nodes": sorted(dep.instances),
                "pipelines": pipes,
                "queued": len(dep.server.queue),
                "ongoing": len(dep.requests),
                "host_copies": self.pool.complete(dep.name, "host"),
                "pinned_host_copy": dep.pinned_node,
                "last_start": dep.last_start,
                "scale_outs": dep.scale_outs,
                "kv_migrated": dep.kv_migrated,
                "live_prefilled": dep.live_prefilled,
                "num_blocks": dep.manifest.num_blocks,
                "bytes": dep.manifest.total_bytes,
            },
        }

    # ---- requests ----------------------------------------------------------------

    def context_limit(self, dep: Deployment) -> int:
        return context_limit(dep.manifest.arch, self.engine)

    async def submit(
        self, dep: Deployment, prompt_token_ids: list[int], params: SamplingParams
    ) -> TrackedRequest:
        req = TrackedRequest(f"{dep.name}-{time.monotonic_ns()}", list(prompt_token_ids), params)
        req.deployment = dep.name
        dep.requests[req.req_id] = req
        dep.server.requests[req.req_id] = req
        await dep.server.submit(req)
        if not dep.instances:
            self._tick_now.set()  # a request at zero: scale out at once (activator)
        return req

    def finished(self, req: TrackedRequest, status: str = "ok") -> None:
        """Book-keeping when the API is done with a request (metrics, forget it)."""
        dep = self.deployments.get(req.deployment)
        m = self.metrics
        m.requests.labels(req.deployment, status).inc()
        m.tokens.labels(req.deployment).inc(len(req.output_token_ids))
        if req.first_token_t is not None:
            ttft = req.first_token_t - req.arrival_t
            m.ttft.labels(req.deployment).observe(ttft)
            if dep is not None and dep.spec.slo.ttft_ms and ttft * 1000 <= dep.spec.slo.ttft_ms:
                m.slo_ttft_ok.labels(req.deployment).inc()
            n = len(req.token_times)
            if n > 1:
                m.tpot.labels(req.deployment).observe(
                    (req.token_times[-1] - req.token_times[0]) / (n - 1)
                )
        if dep is None:
            return
        dep.requests.pop(req.req_id, None)
        dep.server.requests.pop(req.req_id, None)
        if not req.done.is_set() or req.finish_reason in ("stop_string", "abort"):
            self._abort_on_endpoint(dep, req)

    def _abort_on_endpoint(self, dep: Deployment, req: TrackedRequest) -> None:
        """Stop generating a request nobody waits for (stop string hit, client gone)."""
        req.finish(req.finish_reason or "abort")
        for ep in list(dep.server.endpoints.values()):
            if req.req_id not in ep.requests:
                continue
            ep.requests.pop(req.req_id, None)
            if isinstance(ep, LocalEndpoint):
                self._spawn(
                    dep,
                    self.client.request(  # type: ignore[union-attr]
                        ep.node,
                        {"op": "instance_abort", "instance": ep.name, "req_ids": [req.req_id]},
                    ),
                )
        dep.server.queue[:] = [r for r in dep.server.queue if r is not req]

    # ---- events ------------------------------------------------------------------

    async def _pump(self) -> None:
        while True:
            ev = await self._events.get()
            kind = ev.get("type")
            if kind == "arrival":
                model, node, tier = ev.get("model"), ev["node"], ev.get("tier", "host")
                dep = self.deployments.get(model)
                if dep is None:
                    continue
                self.pool.add(model, node, tier, [ev["block"]])
                size = dep.manifest.blocks[ev["block"]].size_bytes
                self.metrics.bytes_moved.labels(model, tier).inc(size)
            elif kind == "agent_down":
                node = ev["node"]
                log.warning("node %d is down", node)
                self.pool.drop_node(node)
                for dep in self.deployments.values():
                    dep.instances.pop(node, None)
                    if dep.pinned_node == node:
                        dep.pinned_node = None
                    dep.host_last_used.pop(node, None)

    # ---- the autoscaler loop -----------------------------------------------------

    async def _loop(self) -> None:
        last = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._tick_now.wait(), self.config.tick_s)
            self._tick_now.clear()
            now = time.monotonic()
            dt, last = now - last, now
            try:
                await self._tick(now, dt)
            except Exception:  # a bug must not stop autoscaling for every model
                log.exception("autoscaler tick failed")

    def settings(self, dep: Deployment) -> AutoscaleSettings:
        """The deployment's knobs within the cluster's instance slots."""
        slots = len(self.live_nodes()) * self.config.slots_per_node
        return dep.spec.autoscaling.capped(slots)

    async def _tick(self, now: float, dt: float) -> None:
        self.metrics.nodes_up.set(len(self.live_nodes()))
        for dep in list(self.deployments.values()):
            self._observe(dep, now, dt)
            await self._autoscale(dep, now)
            if not dep.restoring and not self.pool.invariant_holds(dep.name):
                await self._restore_invariant(dep)
        self._expire_host_copies(now)

    def _observe(self, dep: Deployment, now: float, dt: float) -> None:
        m, name = self.metrics, dep.name
        for inst in dep.instances.values():
            ep = inst.endpoint
            if ep is None or ep.outstanding > 0:
                inst.idle_since = None
            elif inst.idle_since is None:
                inst.idle_since = now
            if inst.endpoint is not None:
                dep.host_last_used[inst.node] = now
        pipes = sum(isinstance(e, PipelineEndpoint) for e in dep.server.endpoints.values())
        m.queue.labels(name).set(len(dep.server.queue))
        m.ongoing.labels(name).set(len(dep.requests))
        m.instances.labels(name).set(len(dep.serving()))
        m.loading.labels(name).set(len(dep.instances) - len(dep.serving()))
        m.pipelines.labels(name).set(pipes)
        if dep.instances:
            m.gpu_seconds.labels(name).inc(len(dep.instances) * dt)

    async def _autoscale(self, dep: Deployment, now: float) -> None:
        """One decision of `surge.policy.autoscale` for the deployment, carried out."""
        loads = tuple(
            InstanceLoad(
                instance_id=i.node,
                outstanding=i.endpoint.outstanding if i.endpoint else 0,
                loading=i.endpoint is None,
                idle_since_s=i.idle_since,
            )
            for i in dep.instances.values()
        )
        ongoing = sum(1 for r in dep.requests.values() if not r.done.is_set())
        queued = max(0, ongoing - sum(x.outstanding for x in loads))
        decision = decide(PoolLoad(now, queued, loads), self.settings(dep), dep.autoscale_state)
        dep.autoscale_state = decision.state
        if decision.scale_out > 0:
            await self._scale_out(dep, decision.scale_out)
        for node in decision.release:
            await self._release(dep, node)

    def _free_slots(self, node: int) -> int:
        used = sum(node in d.instances for d in self.deployments.values())
        return self.config.slots_per_node - used

    async def _scale_out(self, dep: Deployment, count: int) -> None:
        name = dep.name
        hosts = set(self.pool.complete(name, "host"))
        slots = self.config.slots_per_node
        machines = [
            MachineView(
                machine=n,
                # Global slot ids (node * slots + i), so a placed id names its node.
                free_gpus=tuple(n * slots + i for i in range(max(0, self._free_slots(n)))),
                has_host_copy=n in hosts,
                nic_load=self.nic_load.get(n, 0),
            )
            for n in self.live_nodes()
            if n not in dep.instances
        ]
        placed = place(machines, PlacementRequest(gpus_per_instance=1, num_instances=count))
        dests = [gpus[0] // slots for gpus in placed]
        if not dests:
            return
        for d in dests:
            dep.instances[d] = Instance(d)
            self.nic_load[d] = self.nic_load.get(d, 0) + 1
        was_zero = not any(i.endpoint for i in dep.instances.values() if i.node not in dests)
        ctx = ScaleOutContext(
            client=self.client,  # type: ignore[arg-type]
            server=dep.server,
            manifest=dep.manifest,
            model=name,
            strategy=dep.spec.strategy,
            hot=[n for n in self.pool.complete(name, "gpu") if n not in dests],
            warm=[n for n in hosts if n not in dests],
            local_host={d for d in dests if d in hosts},
            local_disk={d for d in dests if d in self.pool.complete(name, "disk")},
            on_local=lambda node, ep: self._on_local(dep, node, ep),
            make_host_copy=lambda node: self._make_host_copy(dep, node, pin=True),
            engine=self.engine,
            timeout_s=self.config.scale_out_timeout_s,
            # Pipelines of `surge.runtime.scale_out` are named by plan index: one
            # serve-while-loading multicast per model at a time; others load, then serve.
            serve_while_loading=not dep.multicasting,
        )
        dep.multicasting = True
        owns_multicast = ctx.serve_while_loading
        dep.scale_outs += 1
        m = self.metrics
        m.blocks_in_flight.labels(name).inc(len(dests) * dep.manifest.num_blocks)

        async def run() -> None:
            t0 = time.monotonic()
            try:
                kind = await run_scale_out(ctx, dests)
                dep.last_start = kind
                m.scale_outs.labels(name, kind).inc()
                log.info(
                    "%s: %s scale-out to %s in %.2f s", name, kind, dests, time.monotonic() - t0
                )
            except Exception as e:
                log.warning("%s: scale-out to %s failed: %s", name, dests, e)
            finally:
                if owns_multicast:
                    dep.multicasting = False
                m.kv_migrated.labels(name).inc(ctx.kv_migrated)
                m.live_prefilled.labels(name).inc(ctx.live_prefilled)
                dep.kv_migrated += ctx.kv_migrated
                dep.live_prefilled += ctx.live_prefilled
                m.blocks_in_flight.labels(name).dec(len(dests) * dep.manifest.num_blocks)
                for d in dests:
                    self.nic_load[d] = max(0, self.nic_load.get(d, 0) - 1)
                    inst = dep.instances.get(d)
                    if inst is not None and inst.endpoint is None:  # never came up
                        dep.instances.pop(d, None)
                        await self._release_slot(name, d)
            if was_zero and dep.zero_since is not None:
                dep.zero_since = None

        self._spawn(dep, run())

    async def _on_local(self, dep: Deployment, node: int, ep: LocalEndpoint) -> None:
        inst = dep.instances.get(node)
        if inst is None or dep.name not in self.deployments:  # released or deleted meanwhile
            await dep.server.retire(ep.name)
            await self._release_slot(dep.name, node)
            return
        inst.endpoint = ep
        inst.idle_since = None
        dep.host_last_used[node] = time.monotonic()

    async def _release(self, dep: Deployment, node: int) -> None:
        inst = dep.instances.pop(node, None)
        if inst is None:
            return
        if inst.endpoint is not None:
            await dep.server.retire(inst.endpoint.name)
        await self._release_slot(dep.name, node)
        self.metrics.released.labels(dep.name).inc()
        if not dep.instances:
            dep.zero_since = time.monotonic()

    async def _release_slot(self, model: str, node: int) -> None:
        """Close the instance on the node and free its gpu copy."""
        if node in (self.client.down if self.client else set()):
            return
        dep = self.deployments.get(model)
        blocks = list(range(dep.manifest.num_blocks)) if dep else []
        with contextlib.suppress(Exception):
            await self.client.request(  # type: ignore[union-attr]
                node, {"op": "instance_close", "instance": instance_name(model, node)}
            )
            await self.client.request(  # type: ignore[union-attr]
                node, {"op": "evict", "model": model, "tier": "gpu", "blocks": blocks}
            )
        self.pool.remove(model, node, "gpu", blocks)

    # ---- host caches (keep-alive, LRU, the pinned copy) --------------------------

    def _host_entries(self, node: int, now: float) -> list[CacheEntry]:
        out = []
        for dep in self.deployments.values():
            if node in self.pool.complete(dep.name, "host") or self.pool.blocks_at(
                dep.name, node, "host"
            ):
                out.append(
                    CacheEntry(
                        dep.name,
                        dep.manifest.total_bytes,
                        dep.host_last_used.get(node, self.started_t),
                        pinned=dep.pinned_node == node,
                    )
                )
        return out

    def _cache_settings(self) -> CacheSettings:
        return CacheSettings(self.config.host_cache_bytes, self.config.host_keep_alive_s)

    def _expire_host_copies(self, now: float) -> None:
        for node in self.live_nodes():
            entries = self._host_entries(node, now)
            for model in expired(entries, now, self._cache_settings()):
                dep = self.deployments[model]
                if node in dep.instances:
                    continue
                self._evict_host(dep, node)

    def _evict_host(self, dep: Deployment, node: int) -> None:
        blocks = list(range(dep.manifest.num_blocks))
        self.pool.remove(dep.name, node, "host", blocks)
        self._spawn(
            dep,
            self.client.request(  # type: ignore[union-attr]
                node, {"op": "evict", "model": dep.name, "tier": "host", "blocks": blocks}
            ),
        )

    async def _make_host_copy(self, dep: Deployment, node: int, pin: bool) -> None:
        """Load the model into a node's host tier from its disk (if there) or the registry,
        evicting LRU unpinned copies to make room."""
        now = time.monotonic()
        entry = CacheEntry(dep.name, dep.manifest.total_bytes, now, pinned=pin)
        decision = admit(self._host_entries(node, now), entry, self._cache_settings())
        for victim in decision.evict:
            if victim in self.deployments:
                self._evict_host(self.deployments[victim], node)
        blocks = list(range(dep.manifest.num_blocks))
        on_disk = set(blocks) <= self.pool.blocks_at(dep.name, node, "disk")
        await self.client.request(  # type: ignore[union-attr]
            node,
            {
                "op": "load",
                "model": dep.name,
                "blocks": blocks,
                "source": "disk" if on_disk else "remote",
                "tier": "host",
            },
        )
        self.pool.add(dep.name, node, "host", blocks)
        dep.host_last_used[node] = now
        if pin:
            dep.pinned_node = node

    async def _restore_invariant(self, dep: Deployment) -> None:
        """Give the model a complete, pinned host copy on the node with most room."""
        live = self.live_nodes()
        if not live:
            return
        now = time.monotonic()

        def room(n: int) -> int:
            return self.config.host_cache_bytes - sum(
                e.size_bytes for e in self._host_entries(n, now)
            )

        node = min(live, key=lambda n: (-room(n), n))
        dep.restoring = True

        async def run() -> None:
            try:
                await self._make_host_copy(dep, node, pin=True)
            except Exception as e:
                log.warning("%s: host copy on node %d failed: %s", dep.name, node, e)
            finally:
                dep.restoring = False

        task = self._spawn(dep, run())
        if dep.scale_outs == 0:
            await asyncio.shield(task)  # at creation: the first start is warm

    def _spawn(self, dep: Deployment, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        dep.tasks.add(task)
        task.add_done_callback(dep.tasks.discard)
        return task

    # ---- views -------------------------------------------------------------------

    def nodes_view(self) -> list[dict[str, Any]]:
        down = self.client.down if self.client else set()
        pids: dict[int, int] = {}
        if hasattr(self.cluster, "pids"):  # RayCluster
            pids = self.cluster.pids
        elif self.cluster is not None:
            pids = {n: p.pid for n, p in self.cluster.procs.items()}
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
