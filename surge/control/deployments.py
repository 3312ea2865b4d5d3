"""Deployments: create, delete, bring back after a restart, tear down, describe.

What flows: a `DeploymentSpec` in (API, config file, the SQLite store on restart); out, a
`Deployment` record registered on every live agent at its store's version (another version
of the name dropped there first: `policy.versions`), its model in the registry the agents
read (`registry.py`), what an older controller left running adopted or closed at a restart
(`adoption.py`), and its pinned host copy (BlitzScale §5.3, through `copies.py`). Deletion
answers at once: it drops the model on every agent (`DropModelOp`: running loads aborted,
instances closed, every copy evicted). The ops on the agents (register, drop, another
version dropped first) are `agent_models.py`.
A store is verified when deployed (every block's checksum: a bad one is refused with one
error); a stored deployment that cannot come back after a restart (its store missing or
damaged), or whose store goes bad later (a load fails and the store no longer verifies),
is *failed*: torn down, listed with its reason in `failed`, deletable, never retried.
Dependencies are passed in by `control/controller.py`. Owned by control/.
"""

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from surge.control.adoption import Adopter
from surge.control.agent_models import drop_model, drop_other_versions, register_version
from surge.control.copies import Copies
from surge.control.flexpipe import describe_flexpipe
from surge.control.metrics import Metrics
from surge.control.pool import ParameterPool
from surge.control.registry import prepare_store
from surge.control.spec import DeploymentSpec, new_deployment
from surge.control.state import Deployment, FailedDeployment, refuse
from surge.control.store import DeploymentStore
from surge.errors import Conflict, NotFound, SurgeError, Unavailable, shorten
from surge.model.manifest import MANIFEST_NAME, Manifest, read_manifest, verify_store
from surge.policy.adoption import Action
from surge.policy.blitzscale.monitor import StepProfile
from surge.runtime.client import ClusterClient
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.protocol import StatusOp
from surge.runtime.scaleout.ilp_warmup import warm_solver
from surge.runtime.server import Server

log = logging.getLogger(__name__)

CLEANUP_WAIT_S = 1.0
"""How long a teardown waits for its cancelled tasks' clean-up (their calls were cancelled
mid-exchange: milliseconds; the bound keeps one stuck elsewhere from holding a delete)."""


async def _no_profile(spec: DeploymentSpec, manifest: Manifest) -> StepProfile | None:
    return None


class Deployments:
    """The deployments' lifecycle; `deployments` is the controller's registry of them."""

    def __init__(
        self,
        client: ClusterClient,
        pool: ParameterPool,
        metrics: Metrics,
        store: DeploymentStore,
        registry: Path,
        deployments: dict[str, Deployment],
        copies: Copies,
        live_nodes: Callable[[], list[int]],
        adopter: Adopter,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.client, self.pool, self.metrics = client, pool, metrics
        self.store, self.registry, self.deployments = store, registry, deployments
        self.clock = clock
        """The control plane's clock: each deployment's `Server` stamps its requests with it."""
        self.copies, self.live_nodes = copies, live_nodes
        self.adopter = adopter
        """Adopts what an old controller left running at a restart (`restore_all`)."""
        self.failed: dict[str, FailedDeployment] = {}
        """Stored deployments that cannot serve, by name (listed, deletable, not retried)."""
        self.check_capacity: Callable[[DeploymentSpec], None] = lambda spec: None
        """Refuses a spec the cluster can never hold (set by the controller)."""
        self.step_profile: Callable[
            [DeploymentSpec, Manifest], Coroutine[Any, Any, StepProfile | None]
        ] = _no_profile
        """The real engine's step profile of a deployment's model, kept or taken now (in a
        child process; set by the controller: `control/emulation.deployment_profile`)."""
        self._lock = asyncio.Lock()
        """Creations and deletions one at a time (a name is checked, then taken)."""
        self._verified: dict[str, tuple] = {}
        """Per deployment, the store's file stamps when it last verified (no re-read while
        nothing changed)."""

    async def restore_all(self) -> None:
        """Bring back every stored deployment (a controller restart); one that cannot
        come back is listed as failed with its reason. What the old controller left running
        on the agents is adopted or closed (`control/adoption.py`, `policy.adoption`)."""
        opened: dict[str, tuple[DeploymentSpec, Manifest, Any]] = {}
        live = self.live_nodes()
        statuses = await self.client.broadcast(StatusOp(), live)
        for spec in self.store.all():
            try:
                manifest, tokenizer = await self._open(spec, restoring=True)
                self.store.restored(spec.name, manifest.digest)  # replaced meanwhile? says so
                opened[spec.name] = (spec, manifest, tokenizer)
            except SurgeError as e:
                self._cannot_restore(spec, e)
        # What runs is adopted or closed before the stores' versions are registered: an
        # agent refuses another version of a model an instance of its runs on
        # (`policy.versions`), and the plan drops such a version first.
        plan = self.adopter.plan(statuses, {n: (s, m) for n, (s, m, _) in opened.items()})
        await self.adopter.clean(plan, {n: m for n, (_, m, _) in opened.items()})
        for name, (spec, manifest, _) in list(opened.items()):
            try:
                await self._register(name, manifest, live)
            except SurgeError as e:
                del opened[name]
                self._cannot_restore(spec, e)
        for node, status in (await self.client.broadcast(StatusOp(), live)).items():
            self.pool.load_status(node, status)
        for spec, manifest, tokenizer in opened.values():
            try:
                await self._start(spec, manifest, tokenizer, plan)
            except SurgeError as e:
                self._cannot_restore(spec, e)

    def _cannot_restore(self, spec: DeploymentSpec, e: SurgeError) -> None:
        log.error("deployment %s cannot come back: %s", spec.name, e)
        self.failed[spec.name] = FailedDeployment(spec, str(e))

    async def create(self, body: Any) -> Deployment:
        spec = new_deployment(body)
        self.check_capacity(spec)
        async with self._lock:
            if spec.name in self.failed:
                raise Conflict(
                    f"deployment {spec.name!r} exists and has failed "
                    f"({self.failed[spec.name].reason}); delete it first"
                )
            if spec.name in self.deployments:
                raise Conflict(f"deployment {spec.name!r} already exists")
            await asyncio.to_thread(prepare_store, self.registry, spec)
            self.store.add(spec)
            try:
                dep = await self.activate(spec)
            except BaseException:
                self.store.remove(spec.name)
                raise
            if self.deployments.get(spec.name) is not dep:  # deleted while its copies loaded
                self.store.remove(spec.name)
                raise Conflict(f"deployment {spec.name!r} was deleted while it was being created")
            return dep

    async def delete(self, name: str) -> None:
        dep = self.deployments.get(name)
        stopped = False
        if dep is not None and dep.creating:  # its creation holds the lock while its kept
            stopped = True  # host copies load: stop them now (the creation answers 409)
            await self.teardown(dep, evict=True)
        async with self._lock:
            dep = self.deployments.get(name)
            if dep is None and self.failed.pop(name, None) is None and not stopped:
                raise NotFound(f"no deployment {name!r}")
            if dep is not None:
                await self.teardown(dep, evict=True)
            self.failed.pop(name, None)
            self._verified.pop(name, None)
            self.store.remove(name)
            link = self.registry / name
            if link.is_symlink():
                link.unlink()

    async def activate(self, spec: DeploymentSpec) -> Deployment:
        """Register a new deployment on every agent and give it its pinned host copy."""
        manifest, tokenizer = await self._open(spec, restoring=False)
        name, live = spec.name, self.live_nodes()
        self.store.record_digest(name, manifest.digest)  # what a restart compares against
        await drop_other_versions(self.client, name, manifest, live)
        await self._register(name, manifest, live)
        for node, status in (await self.client.broadcast(StatusOp(), live)).items():
            self.pool.load_status(node, status)
        # Device copies of an older deployment of the name (none normally) are not its own.
        for node in live:
            if self.pool.blocks_at(name, node, "gpu"):
                await self.copies.release_slot(name, node, manifest.num_blocks)
        return await self._start(spec, manifest, tokenizer)

    async def _open(self, spec: DeploymentSpec, restoring: bool) -> tuple[Manifest, Any]:
        """The deployment's store (put in the registry if missing) and tokenizer. After a
        restart (`restoring`) the store's block files are checked by size only (a checksum
        read of every block would slow every restart; a damaged block is found when it is
        loaded)."""
        # Its first live look must not wait for the zigzag ILP's import (ilp_warmup.py).
        warm_solver(spec.system)
        store = self.registry / spec.name
        if not (store / MANIFEST_NAME).is_file():
            await asyncio.to_thread(prepare_store, self.registry, spec)
        manifest = read_manifest(store)
        if restoring:
            await asyncio.to_thread(verify_store, manifest, False)
        tokenizer = None
        if manifest.tokenizer_file and (store / manifest.tokenizer_file).is_file():
            from surge.model.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(store / manifest.tokenizer_file)
        return manifest, tokenizer

    async def _register(self, name: str, manifest: Manifest, live: list[int]) -> None:
        """Register the model's version on every live node (`register_version`) and in
        the parameter pool."""
        await register_version(self.client, name, manifest, live)
        self.pool.add_model(name, manifest.num_blocks, manifest.digest)

    async def _start(
        self,
        spec: DeploymentSpec,
        manifest: Manifest,
        tokenizer: Any,
        adopted: tuple[Action, ...] = (),
    ) -> Deployment:
        """The deployment's record, serving: the instances `adopted` (a restart's), then
        its kept host copies (awaited)."""
        routing = spec.system.routing
        name = spec.name
        dep = Deployment(spec, manifest, tokenizer, Server(self.client, name, routing, self.clock))
        dep.spawn(self._take_profile(dep))
        self.deployments[name] = dep
        await self.adopter.adopt(dep, adopted)
        dep.creating = True
        try:
            await self.copies.restore_invariant(dep)
        finally:
            dep.creating = False
        return dep

    async def _take_profile(self, dep: Deployment) -> None:
        """BlitzScale §5.3's "profiled offline" bounds: the deployment serves at once, its
        monitor on the host's estimates until its engine's step profile is read or taken
        (a kept one: the seconds a child process takes to start), then on the profile."""
        dep.step_profile = await self.step_profile(dep.spec, dep.manifest)

    async def load_failed(self, dep: Deployment, error: Exception) -> None:
        """A load of `dep` failed (a host copy or a scale-out): if its store no longer
        verifies, the deployment fails (one log line, no more retries); else it is left to
        retry (a node went down, a timeout)."""
        if dep.failure is not None or dep.name not in self.deployments:
            return
        try:
            await asyncio.to_thread(self._verify_changed, dep)
        except SurgeError as e:
            await self.fail(dep, str(e))

    def _verify_changed(self, dep: Deployment) -> None:
        """Verify the store's checksums unless its files are as they were when it last
        verified (size and modification time of each)."""
        m = dep.manifest
        try:
            stamps = tuple(
                (s.st_size, s.st_mtime_ns) for s in (m.block_path(b.index).stat() for b in m.blocks)
            )
        except OSError:
            stamps = None
        if stamps is not None and self._verified.get(dep.name) == stamps:
            return
        verify_store(m)
        self._verified[dep.name] = stamps

    async def fail(self, dep: Deployment, reason: str) -> None:
        """Mark `dep` failed: its requests answer 503 with the reason, its instances and
        copies go, and it stays listed (failed) until deleted."""
        if dep.failure is not None:
            return
        dep.failure = reason
        log.error("deployment %s failed: %s; delete it and deploy it again", dep.name, reason)
        self.failed[dep.name] = FailedDeployment(dep.spec, reason)
        error = Unavailable(f"deployment {dep.name!r} has failed: {reason}")
        for req in list(dep.requests.values()):
            refuse(req, error)
        await self.teardown(dep, evict=True)

    def lookup(self, name: str) -> Deployment:
        """The serving deployment `name`: `NotFound` if there is none, `Unavailable` (503)
        with the reason if it has failed."""
        dep = self.deployments.get(name)
        if dep is not None:
            return dep
        failed = self.failed.get(name)
        if failed is not None:
            raise Unavailable(
                f"deployment {name!r} has failed: {failed.reason}; delete it and deploy it again"
            )
        raise NotFound(
            f"the model {shorten(name)!r} does not exist; GET /v1/models lists the deployed ones",
            param="model",
            code="model_not_found",
        )

    async def teardown(self, dep: Deployment, evict: bool) -> None:
        """Forget the deployment: cancel its work, end its requests, close its router;
        with `evict`, close its instances and drop every copy from the agents."""
        self.deployments.pop(dep.name, None)
        me = asyncio.current_task()
        cancelled = [t for t in dep.tasks if t is not me]  # a failing load of its own may be
        for t in cancelled:  # what tears it down
            t.cancel()
        if cancelled:  # their clean-up (a slot's release) runs before the model goes
            await asyncio.wait(cancelled, timeout=CLEANUP_WAIT_S)
        why = "was deleted" if evict else "stopped: the server is shutting down"
        gone = Unavailable(f"the deployment {dep.name!r} {why} while this request ran")
        for req in list(dep.requests.values()):  # an error, never a silent "stop" (issue 36)
            refuse(req, gone)
        await dep.server.close()
        self.metrics.forget(dep.name)
        if not evict:
            return
        # Every node at once, each on a connection of its own: a load still running on the
        # control connection (an SSD or registry read) is aborted there, not waited for.
        await asyncio.gather(*(drop_model(self.client, dep.name, n) for n in self.live_nodes()))
        self.pool.drop_model(dep.name)

    def describe_failed(self, failed: FailedDeployment) -> dict[str, Any]:
        """A failed deployment as the admin API shows it: the same keys, nothing running."""
        zero = {k: 0 for k in ("instances", "loading", "pipelines", "queued", "ongoing")}
        return {
            **failed.spec.to_json(),
            "status": {**zero, "state": "failed", "failure": failed.reason, "nodes": []},
        }

    def describe(self, dep: Deployment) -> dict[str, Any]:
        """The deployment's spec and status (the admin API's JSON)."""
        return {
            **dep.spec.to_json(),
            "status": {
                "state": "failed" if dep.failure else "serving",
                "failure": dep.failure,
                "instances": len(dep.serving()),
                "loading": len(dep.instances) - len(dep.serving()),
                "nodes": sorted(dep.instances),
                "pipelines": dep.num_pipelines(),
                "queued": len(dep.server.queue),
                "ongoing": len(dep.requests),
                "host_copies": self.pool.complete(dep.name, "host"),
                "pinned_host_copy": dep.pinned_node,
                "last_start": dep.last_start,
                "scale_outs": dep.num_scale_outs,
                "kv_migrated": dep.num_kv_migrated,
                "live_prefilled": dep.num_live_prefilled,
                "num_blocks": dep.manifest.num_blocks,
                "bytes": dep.manifest.total_bytes,
                "flexpipe": describe_flexpipe(dep),
            },
        }
