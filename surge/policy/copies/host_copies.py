"""Host copies of deployed models: which nodes keep a pinned copy, which copies expire, and
where a new host copy is read from.

In: the system's `host_cache` choice (`policy.systems.HOST_CACHES`), each live node's host
cache as `NodeHostCache` (its `CacheEntry`s from `surge.policy.copies.keepalive`, and the
models with an instance on it), the cache settings, the nodes already holding a complete
host copy of a model (and those whose copy is pinned now). Out: the `PinnedCopy`s a deployed
model keeps (each node and whether the copy must be loaded there), the (node, model) copies
to evict now, and the `load` source of a new copy. `surge serve`'s controller
(`control/copies.py`, at a deployment's creation and on every autoscaler tick) and the
simulator (`sim/host_cache.py`, at time 0) carry them out; neither decides anything itself.

Rules:
- Which copies a deployed model keeps before any use (`kept_copies`), by the system's
  `host_cache`: `pinned-one` one pinned copy (below); `all` a pinned copy on every live
  node (AllCache; FlexPipe §7's host-memory tier); `lru` none (ServerlessLLM: the cache
  fills with the models its instances load, LRU and keep-alive: `copy_after_load`);
  `pinned-lru` both (λScale: the one pinned copy, and LRU copies as ServerlessLLM's); and
  `none` none
  (ParaServe §4, FaaSNet, NCCL: a cold start reads the registry or the SSD). So a system
  without a host cache starts cold from its tier, as its paper deploys it.
- BlitzScale §5.3 O(1) host caching (`pinned-one`; in `pinned-lru` λScale's
  registered-memory replica, FaaScale §5: "one complete replica in RDMA-accessible
  registered memory somewhere in the cluster", the source of a 0-to-N scale-out):
  every deployed model keeps one complete copy in some node's host memory, pinned (never
  evicted). An existing complete copy is pinned (the one pinned already, else the lowest
  node id: no load at all); with none, a copy is loaded on the node with the most
  free host memory (ties: lowest node id), so the pinned copies spread over the cluster.
- LRU copies (`caches_after_load`): ServerlessLLM's cache, and λScale's "best-effort local
  host memory caching" (λScale §7.5: "As ServerlessLLM", falling back to multicast on a
  miss; §7.3: "λScale is configured to utilize local memory caching similarly to
  ServerlessLLM"): a node keeps the copy its instance loaded or released.
- Keep-alive (ServerlessLLM, `policy.copies.keepalive.expired`): an unpinned copy unused for the
  keep-alive leaves host memory, but never from a node where the model has an instance
  (loading or serving: its host copy is in use).
- A new copy is read from the node's own disk when every block is there, else from the
  registry.
Pure and deterministic.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from surge.policy.copies.keepalive import (
    CacheDecision,
    CacheEntry,
    CacheSettings,
    admit,
    expired,
)

LRU_CACHES = ("lru", "pinned-lru")
"""`host_cache` choices whose nodes keep what their instances load (see the docstring)."""


def caches_after_load(host_cache: str) -> bool:
    """Whether the system's nodes keep an LRU host copy of what their instances load or
    release (`copy_after_load` decides whether there is room)."""
    return host_cache in LRU_CACHES


@dataclass(frozen=True)
class NodeHostCache:
    """One live node's host memory, as this policy sees it."""

    node: int
    """Node id."""
    entries: tuple[CacheEntry, ...]
    """Models held (wholly or in part) in its host memory."""
    busy_models: frozenset[str] = frozenset()
    """Models with an instance (loading or serving) on this node."""

    def free_bytes(self, capacity_bytes: int) -> int:
        """Host cache bytes not taken by the entries (negative when over capacity)."""
        return capacity_bytes - sum(e.size_bytes for e in self.entries)


@dataclass(frozen=True)
class PinnedCopy:
    """Where a model's pinned host copy is."""

    node: int
    """The node holding (or to hold) the pinned copy."""
    needs_load: bool
    """True: no complete host copy exists; load one there first."""


def pinned_copy(
    caches: Sequence[NodeHostCache],
    settings: CacheSettings,
    complete_on: Sequence[int],
    pinned_on: Collection[int] = (),
) -> PinnedCopy | None:
    """The pinned copy of a model whose complete host copies are on `complete_on` (live nodes
    only count; one already pinned, in `pinned_on`, stays the pinned one); None when no
    node is live."""
    live = {c.node for c in caches}
    held = sorted(n for n in complete_on if n in live)
    if held:
        kept = [n for n in held if n in pinned_on]
        return PinnedCopy((kept or held)[0], needs_load=False)
    if not caches:
        return None
    best = min(caches, key=lambda c: (-c.free_bytes(settings.capacity_bytes), c.node))
    return PinnedCopy(best.node, needs_load=True)


def kept_copies(
    host_cache: str,
    caches: Sequence[NodeHostCache],
    settings: CacheSettings,
    complete_on: Sequence[int],
    pinned_on: Collection[int] = (),
) -> tuple[PinnedCopy, ...]:
    """The pinned host copies a deployed model keeps under the system's `host_cache` (see
    the module docstring), by node; () for `lru` and `none`."""
    if host_cache in ("pinned-one", "pinned-lru"):
        one = pinned_copy(caches, settings, complete_on, pinned_on)
        return () if one is None else (one,)
    if host_cache == "all":
        held = set(complete_on)
        return tuple(PinnedCopy(c.node, c.node not in held) for c in sorted(caches, key=_node))
    if host_cache in ("lru", "none"):
        return ()
    raise ValueError(f"unknown host_cache {host_cache!r}")


def copy_after_load(
    host_cache: str,
    entries: Sequence[CacheEntry],
    incoming: CacheEntry,
    settings: CacheSettings,
    arriving: Sequence[CacheEntry] = (),
) -> CacheDecision:
    """Whether a model loaded into a node's GPU memory (or released from it) keeps a copy
    in that node's host memory, and which copies make room first. ServerlessLLM (`lru`,
    §4: a checkpoint reaches the GPU through a pinned host-memory pool, which stays as a
    cache) and λScale (`pinned-lru`, §7.5: the same best-effort cache beside its pinned
    copy): admitted by `keepalive.admit` (the least recently used unpinned copies go; a
    copy held already is only refreshed: `incoming.last_used_s`); refused when it cannot
    fit. Other systems keep no copy this way (their kept copies are `kept_copies`'s).
    Asked by the simulator (`sim/host_cache.HostCache.touch`, when a load's bytes have
    landed and when an instance is released) and by `surge serve`'s controller
    (`control/copies.Copies.lru_copy`, when a load from the disk or the registry starts,
    so the agent reads it through its host tier, and when a slot is released). `arriving`:
    the node's copies admitted and still loading (`keepalive.admit`: they hold their room,
    so two loads at once cannot overfill the cache; the simulator admits a copy when its
    bytes have landed and has none)."""
    if not caches_after_load(host_cache):
        return CacheDecision(False, ())
    return admit(entries, incoming, settings, arriving)


def _node(c: NodeHostCache) -> int:
    return c.node


def expired_copies(
    caches: Sequence[NodeHostCache], now_s: float, settings: CacheSettings
) -> tuple[tuple[int, str], ...]:
    """(node, model) host copies to evict now, by node then model."""
    out: list[tuple[int, str]] = []
    for c in sorted(caches, key=lambda c: c.node):
        for model in expired(c.entries, now_s, settings):
            if model not in c.busy_models:
                out.append((c.node, model))
    return tuple(out)


def host_copy_source(num_blocks: int, blocks_on_disk: set[int]) -> Literal["disk", "remote"]:
    """Where a node reads a new host copy from: its disk when it holds every block."""
    return "disk" if set(range(num_blocks)) <= blocks_on_disk else "remote"


HOST_COPY_RETRY_FIRST_S = 1.0
"""After a failed pinned host copy (no room in shared memory, a node that went away), the
first retry waits this long; each further failure doubles the wait."""
HOST_COPY_RETRY_MAX_S = 60.0
"""The longest wait between tries: a machine whose shared memory frees up is used within a
minute, and a full one costs one try a minute, not twenty log lines a second."""


def host_copy_retry_s(failures: int) -> float:
    """Seconds to wait before trying a model's pinned host copy again after `failures`
    failures in a row (0: at once)."""
    if failures <= 0:
        return 0.0
    return min(HOST_COPY_RETRY_MAX_S, HOST_COPY_RETRY_FIRST_S * 2 ** (failures - 1))
