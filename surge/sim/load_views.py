"""The policies' frozen load snapshots of one pool's endpoints, rebuilt only when they change.

In: an endpoint's id and the values of the other fields of a policy snapshot
(`policy.router.Endpoint` for a routing decision, `policy.autoscale.InstanceLoad` for an
autoscaler look, `policy.blitzscale.pd.PdInstance` for P/D's), read off the endpoint now.
Out: that snapshot; the one handed out last for this id when every value is equal to its
own, else a new one. Owned by sim/.

Why: each routing decision reads every endpoint of its pool and each autoscaler look every
instance, and most of them have not changed since the last one (measured on FlexPipe §9's
setting, llama2-7b, CV 8: 43 endpoints per decision, building the frozen dataclasses was
most of the cost of a decision). Keyed by value, never by a change signal: the snapshot
handed to the policy is equal, field by field, to the one built fresh, so no decision can
differ (`surge serve` builds its own, `control/load_monitor.pool_load`; tests/parity).
"""

from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class HasId(Protocol):
    """An endpoint, as far as a snapshot is keyed: its id."""

    @property
    def id(self) -> int: ...


E = TypeVar("E", bound=HasId)

KEPT_PER_LIVE = 4
"""Snapshots kept are cleared past this many per endpoint asked for last (released
endpoints' entries go; a cleared one is only built again)."""


class Snapshots(Generic[T]):
    """Snapshots of one kind, by endpoint id (see the module)."""

    __slots__ = ("_by_id", "_make")

    def __init__(self, make: Callable[..., T]) -> None:
        self._make = make
        """Builds one: (endpoint id, *fields)."""
        self._by_id: dict[int, tuple[tuple, T]] = {}

    def get(self, endpoint_id: int, fields: tuple) -> T:
        """The snapshot of `endpoint_id` with `fields` (the snapshot's other fields in
        order)."""
        kept = self._by_id.get(endpoint_id)
        if kept is not None and kept[0] == fields:
            return kept[1]
        snap = self._make(endpoint_id, *fields)
        self._by_id[endpoint_id] = (fields, snap)
        return snap

    def each(self, endpoints: Iterable[E], fields_of: Callable[[E], tuple]) -> list[T]:
        """`get` for each of `endpoints` in order, its fields read by `fields_of` as it
        comes (a routing decision reads every endpoint: one call, not one per endpoint)."""
        by_id, out = self._by_id, []
        for e in endpoints:
            own, endpoint_id = fields_of(e), e.id
            kept = by_id.get(endpoint_id)
            if kept is not None and kept[0] == own:
                out.append(kept[1])
                continue
            snap = self._make(endpoint_id, *own)
            by_id[endpoint_id] = (own, snap)
            out.append(snap)
        return out

    def prune(self, live: int) -> None:
        """Forget every snapshot when many more are kept than the `live` endpoints asked
        for (endpoints come and go over a run; ids are never reused)."""
        if len(self._by_id) > KEPT_PER_LIVE * live + 64:
            self._by_id.clear()
