"""Router: which serving endpoint takes the next request.

In: the endpoints of one pool (`Endpoint`: outstanding requests, the most it accepts,
relative speed). Out: the chosen endpoint id, or None when all are full (the request
waits at the router). Rule: least outstanding per unit of speed (join-the-shortest-
queue weighted by speed, so a slower execution pipeline gets proportionally fewer
requests), ties to the lowest id. Pure and deterministic.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    """An instance or execution pipeline able to serve now."""

    endpoint_id: int
    """Stable id; ties go to the lowest."""
    outstanding: int
    """Requests queued at or running on it."""
    max_outstanding: int
    """Most requests it accepts at once (its batch and KV limits)."""
    speed: float = 1.0
    """Relative serving speed (> 0); a full instance is 1."""


def route(endpoints: Sequence[Endpoint]) -> int | None:
    """The endpoint for the next request, or None if none has room."""
    best: tuple[float, int] | None = None
    for e in endpoints:
        if e.outstanding >= e.max_outstanding:
            continue
        score = ((e.outstanding + 1) / e.speed, e.endpoint_id)
        if best is None or score < best:
            best = score
    return None if best is None else best[1]
