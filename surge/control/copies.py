"""Copies of deployed models on the agents: host copies (keep-alive, LRU, the pinned copy)
and the release of a slot's GPU copy.

What flows: the controller's deployments and the parameter pool in; agent ops out (`load`
into the host tier, `evict`, `instance_close`), with the pool updated from what the agents
did. Every choice is `surge.policy`'s: which nodes keep a pinned copy, by the system's
`host_cache` (none for ParaServe and ServerlessLLM, one for λScale and BlitzScale, every
node for FlexPipe), which copies expire and which copy a load leaves in ServerlessLLM's LRU
cache (`policy.copies.host_copies`), which copies make room for a new one
(`policy.copies.keepalive`).
Dependencies are passed in by `control/controller.py`. Owned by control/.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable

from surge.control.pool import ParameterPool
from surge.control.settings import ControllerConfig
from surge.control.state import Deployment
from surge.policy.copies.host_copies import (
    NodeHostCache,
    PinnedCopy,
    caches_after_load,
    copy_after_load,
    expired_copies,
    host_copy_retry_s,
    host_copy_source,
    kept_copies,
)
from surge.policy.copies.keepalive import CacheEntry, CacheSettings, admit
from surge.policy.flexpipe.host_keep import keep_host_after_eviction
from surge.runtime.client import ClusterClient
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.protocol import EvictOp, InstanceCloseOp, LoadOp
from surge.runtime.scaleout.context import instance_name

log = logging.getLogger(__name__)


class Copies:
    """Host copies and GPU-slot release for every deployment."""

    def __init__(
        self,
        client: ClusterClient,
        pool: ParameterPool,
        deployments: dict[str, Deployment],
        config: ControllerConfig,
        live_nodes: Callable[[], list[int]],
        started_s: float,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.client, self.pool, self.deployments = client, pool, deployments
        self.clock = clock
        """The control plane's clock (`runtime/clock.py`): keep-alives and back-offs run on
        it (`started_s` is one of its readings)."""
        self.live_nodes = live_nodes
        self.settings = CacheSettings(config.host_cache_bytes, config.host_keep_alive_s)
        self.started_s = started_s
        """Last use assumed for copies found at start (agents that outlived a controller)."""
        self.failures: dict[str, tuple[int, float]] = {}
        """Per model, failed pinned host copies in a row and when to try again."""
        self.load_failed: Callable[[Deployment, Exception], Awaitable[None]] | None = None
        """Told of a failed host copy (a damaged store fails the deployment: no retries)."""
        self.arriving: dict[int, dict[str, CacheEntry]] = {}
        """Per node, the host copies admitted whose load is still reading into them: they
        hold their room in every admission meanwhile (`keepalive.admit`'s `arriving`), as
        the pool learns of their blocks only as they land."""

    # ---- GPU copies --------------------------------------------------------------

    async def release_slot(self, model: str, node: int, num_blocks: int) -> None:
        """Close the model's local instance on the node and evict its GPU copy.

        Takes the model's block count, not its deployment: a new controller releases the
        copies an old one left before it registers the deployment. A failing close must not
        skip the eviction, and the pool forgets the GPU copy only once it is evicted."""
        if node in self.client.down:
            return
        try:
            await self.client.call(node, InstanceCloseOp(instance=instance_name(model, node)))
        except Exception as e:  # none open there (never came up, or closed already)
            log.debug("%s: instance_close on node %d: %s", model, node, e)
        blocks = tuple(range(num_blocks))
        keep = self._keeps_host(model, node)
        try:
            op = EvictOp(model=model, blocks=blocks, tier="gpu", keep_host=keep)
            await self.client.call(node, op)
        except Exception as e:  # expected once the deployment is gone (dropped already)
            level = logging.WARNING if model in self.deployments else logging.DEBUG
            log.log(level, "%s: gpu copy on node %d not evicted: %s", model, node, e)
            return
        self.pool.remove(model, node, "gpu", blocks)
        if keep:  # the kept blocks came in as host arrivals: the cache's LRU clock starts
            self.deployments[model].host_last_used_s[node] = self.clock.now_s()

    def _keeps_host(self, model: str, node: int) -> bool:
        """Whether a freed slot's GPU blocks stay in its host tier: an LRU cache
        (ServerlessLLM's, λScale's best-effort one) keeps (or refreshes) the copy
        (`lru_copy`); FlexPipe §7 keeps them when the
        host cache admits the model there without evicting another
        (`policy.flexpipe.host_keep`)."""
        dep = self.deployments.get(model)
        if dep is None:
            return False
        if caches_after_load(dep.spec.system.host_cache):
            return self.lru_copy(dep, node)
        entry = CacheEntry(model, dep.manifest.total_bytes, self.clock.now_s())
        decision = admit(self._entries(node), entry, self.settings, self._arriving(node))
        system = dep.spec.system
        return keep_host_after_eviction(system, decision.admit and not decision.evict)

    def lru_copy(self, dep: Deployment, node: int) -> bool:
        """The LRU host cache of ServerlessLLM and λScale
        (`policy.copies.host_copies.copy_after_load`): the
        model's copy stays in the node's host memory after a load into its GPU memory from
        the disk or the registry (asked as the load starts: the agent reads it through its
        host tier) or after a release. The copies the policy names make room first; the
        copy's last use is now. False for a system without an LRU cache, or no room."""
        now = self.clock.now_s()
        entry = CacheEntry(dep.name, dep.manifest.total_bytes, now, pinned=node in dep.pinned_nodes)
        mode = dep.spec.system.host_cache
        arriving = self._arriving(node)
        decision = copy_after_load(mode, self._entries(node), entry, self.settings, arriving)
        if not decision.admit:
            return False
        for victim in decision.evict:
            if victim in self.deployments:
                self.evict_host(self.deployments[victim], node)
        dep.host_last_used_s[node] = now
        return True

    def copy_through_host(self, dep: Deployment, node: int) -> bool:
        """`lru_copy` for a load into the node's GPU memory that starts now: an admitted
        copy holds its room until `copy_landed` (the load ended, however)."""
        if not self.lru_copy(dep, node):
            return False
        entry = CacheEntry(dep.name, dep.manifest.total_bytes, self.clock.now_s())
        self.arriving.setdefault(node, {})[dep.name] = entry
        return True

    def copy_landed(self, model: str, node: int) -> None:
        """The load reading a host copy into the node ended: the pool's blocks speak for the
        copy from now on (landed blocks arrive as events before or about when the load's
        answer does; a failed load's copy is gone)."""
        self.arriving.get(node, {}).pop(model, None)

    # ---- host copies -------------------------------------------------------------

    def _arriving(self, node: int) -> tuple[CacheEntry, ...]:
        return tuple(self.arriving.get(node, {}).values())

    def _entries(self, node: int) -> tuple[CacheEntry, ...]:
        """The node's host copies the pool knows of (a copy still arriving: `_arriving`)."""
        out = []
        loading = self.arriving.get(node, {})
        for dep in self.deployments.values():
            if dep.name not in loading and self.pool.blocks_at(dep.name, node, "host"):
                out.append(
                    CacheEntry(
                        dep.name,
                        dep.manifest.total_bytes,
                        dep.host_last_used_s.get(node, self.started_s),
                        pinned=node in dep.pinned_nodes,
                    )
                )
        return tuple(out)

    def _caches(self) -> list[NodeHostCache]:
        return [
            NodeHostCache(
                n,
                self._entries(n),
                frozenset(d.name for d in self.deployments.values() if n in d.instances),
            )
            for n in self.live_nodes()
        ]

    def expire(self, now_s: float) -> None:
        """Evict the host copies `policy.copies.host_copies` says have expired."""
        for node, model in expired_copies(self._caches(), now_s, self.settings):
            self.evict_host(self.deployments[model], node)

    def evict_host(self, dep: Deployment, node: int) -> None:
        blocks = tuple(range(dep.manifest.num_blocks))
        self.pool.remove(dep.name, node, "host", blocks)
        dep.spawn(self.client.call(node, EvictOp(model=dep.name, blocks=blocks, tier="host")))

    async def make_host_copy(self, dep: Deployment, node: int, pin: bool) -> None:
        """Load the model into a node's host tier (from its disk or the registry, by
        `policy.copies.host_copies`), evicting the copies `policy.copies.keepalive.admit`
        names first."""
        now = self.clock.now_s()
        entry = CacheEntry(dep.name, dep.manifest.total_bytes, now, pinned=pin)
        decision = admit(self._entries(node), entry, self.settings, self._arriving(node))
        if not decision.admit:  # only an unpinned copy can be refused
            log.info("%s: no room for a host copy on node %d", dep.name, node)
            return
        for victim in decision.evict:
            if victim in self.deployments:
                self.evict_host(self.deployments[victim], node)
        num_blocks = dep.manifest.num_blocks
        source = host_copy_source(num_blocks, self.pool.blocks_at(dep.name, node, "disk"))
        blocks = tuple(range(num_blocks))
        self.arriving.setdefault(node, {})[dep.name] = entry
        try:
            await self.client.call(
                node, LoadOp(model=dep.name, blocks=blocks, source=source, tier="host")
            )
        except BaseException:  # the agent removed what it made; blocks it announced go too
            self.pool.remove(dep.name, node, "host", blocks)
            raise
        finally:
            self.copy_landed(dep.name, node)
        self.pool.add(dep.name, node, "host", blocks)
        dep.host_last_used_s[node] = now
        if pin:
            dep.pinned_nodes.add(node)

    def kept(self, dep: Deployment) -> tuple[PinnedCopy, ...]:
        """The pinned host copies the deployment keeps now, by its system's `host_cache`
        (`policy.copies.host_copies.kept_copies`)."""
        return kept_copies(
            dep.spec.system.host_cache,
            self._caches(),
            self.settings,
            self.pool.complete(dep.name, "host"),
            dep.pinned_nodes,
        )

    async def restore_invariant(self, dep: Deployment) -> None:
        """Give the model the pinned host copies `kept` says (BlitzScale §5.3: one complete
        copy, an existing one or else on the roomiest node; every node for `all`; none for
        `lru` and `none`, whose first start is cold from the SSD or the registry). Copies
        pinned before and no longer kept are unpinned (the keep-alive may take them)."""
        failures, retry_at = self.failures.get(dep.name, (0, 0.0))
        if self.clock.now_s() < retry_at:  # backing off after a failure (policy.copies.host_copies)
            return
        kept = self.kept(dep)
        dep.pinned_nodes = {c.node for c in kept if not c.needs_load}
        loads = [c.node for c in kept if c.needs_load]
        if not loads:
            return
        dep.restoring = True

        async def run() -> None:
            try:
                made = (self.make_host_copy(dep, n, pin=True) for n in loads)
                errors = [
                    r
                    for r in await asyncio.gather(*made, return_exceptions=True)
                    if isinstance(r, BaseException)
                ]
                if errors:  # every load has ended (none left running unowned)
                    raise errors[0]
            except Exception as e:
                if self.load_failed is not None:
                    await self.load_failed(dep, e)
                wait_s = host_copy_retry_s(failures + 1)
                self.failures[dep.name] = (failures + 1, self.clock.now_s() + wait_s)
                if dep.failure is None:  # once, then quietly until it works (no log flood)
                    (log.warning if failures == 0 else log.debug)(
                        "%s: host copy on nodes %s failed (try %d; next in %.0f s): %s",
                        dep.name, loads, failures + 1, wait_s, e,
                    )  # fmt: skip
            else:
                if self.failures.pop(dep.name, None) is not None:
                    log.warning("%s: host copy made on nodes %s after %d failed tries",
                                dep.name, loads, failures)  # fmt: skip
            finally:
                dep.restoring = False

        task = dep.spawn(run())
        if dep.num_scale_outs == 0:  # at creation: a kept copy makes the first start warm
            await asyncio.wait([task])  # (a delete meanwhile cancels it: no error here)

    def invariant_holds(self, dep: Deployment) -> bool:
        """The deployment's pinned host copies are the complete ones `kept` says."""
        kept = self.kept(dep)
        return not any(c.needs_load for c in kept) and dep.pinned_nodes == {c.node for c in kept}

    def node_down(self, node: int) -> None:
        """A node died: its copies are gone (the invariant is restored on the next tick)."""
        self.pool.drop_node(node)
        self.arriving.pop(node, None)
        for dep in self.deployments.values():
            dep.pinned_nodes.discard(node)
            dep.host_last_used_s.pop(node, None)
