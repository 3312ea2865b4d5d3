"""Host-memory model cache: keep-alive expiry and LRU eviction.

In: the entries cached on one machine (`CacheEntry`: model, bytes, last use, pinned),
`CacheSettings` (capacity, keep-alive) and, to admit, an incoming entry. Out: which
entries expire now (`expired`), and whether the incoming one fits and which to evict
(`admit`, a `CacheDecision`; copies still arriving take their room and are never victims).

Policies it expresses:
- ServerlessLLM (and λScale §2.3 Fig. 2/3): LRU over a fixed capacity, optionally a
  keep-alive after which an unused model leaves memory;
- BlitzScale §5.3 O(1) host caching: one pinned copy per model cluster-wide, never
  evicted (the caller pins it);
- AllCache: capacity large enough for every model, no keep-alive.
Victims are the least recently used unpinned entries (ties: model name). Pure.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from surge.errors import SurgeError


@dataclass(frozen=True)
class CacheSettings:
    """Capacity and expiry of one machine's host cache. Validated at construction."""

    capacity_bytes: int
    """Host memory given to cached models (>= 0)."""
    keep_alive_s: float | None = None
    """An unused, unpinned model leaves after this long; None = only LRU evicts."""

    def __post_init__(self) -> None:
        if self.capacity_bytes < 0:
            raise SurgeError("host cache capacity must be >= 0 bytes")
        if self.keep_alive_s is not None and self.keep_alive_s < 0:
            raise SurgeError("keep_alive_s must be >= 0 or None")


@dataclass(frozen=True)
class CacheEntry:
    """One model in one machine's host memory."""

    model: str
    """Model name."""
    size_bytes: int
    """Bytes it takes."""
    last_used_s: float
    """Last time it was loaded into a GPU or admitted."""
    pinned: bool = False
    """Never evicted (BlitzScale's one guaranteed copy)."""


@dataclass(frozen=True)
class CacheDecision:
    """Outcome of admitting a model."""

    admit: bool
    """Whether the incoming model gets cached."""
    evict: tuple[str, ...]
    """Models to drop first, in order."""


def expired(
    entries: Sequence[CacheEntry], now_s: float, settings: CacheSettings
) -> tuple[str, ...]:
    """Unpinned models unused for at least the keep-alive (sorted by name)."""
    if settings.keep_alive_s is None:
        return ()
    return tuple(
        sorted(
            e.model
            for e in entries
            if not e.pinned and now_s - e.last_used_s >= settings.keep_alive_s
        )
    )


def admit(
    entries: Sequence[CacheEntry],
    incoming: CacheEntry,
    settings: CacheSettings,
    arriving: Sequence[CacheEntry] = (),
) -> CacheDecision:
    """Whether `incoming` fits after evicting LRU unpinned entries, and which ones.

    `arriving`: copies admitted already whose bytes are still on their way into this
    machine's host memory (a body that decides when a load starts, as `surge serve`'s
    controller: the agent must know whether to read through its host tier). They take
    their room and are never victims (their load is reading into them); an incoming model
    arriving already is only refreshed. Without them two loads starting at once onto one
    machine would each see the other's room as free and together exceed the capacity."""
    if any(e.model == incoming.model for e in (*entries, *arriving)):
        return CacheDecision(True, ())
    used = sum(e.size_bytes for e in (*entries, *arriving))
    free = settings.capacity_bytes - used
    if free >= incoming.size_bytes:
        return CacheDecision(True, ())
    victims: list[str] = []
    for e in sorted((e for e in entries if not e.pinned), key=lambda e: (e.last_used_s, e.model)):
        victims.append(e.model)
        free += e.size_bytes
        if free >= incoming.size_bytes:
            return CacheDecision(True, tuple(victims))
    if incoming.pinned:
        return CacheDecision(True, tuple(victims))
    return CacheDecision(False, ())
