"""Router: which serving endpoint takes the next request.

In: the endpoints of one pool (`Endpoint`: outstanding requests, the most it accepts,
relative speed, the requests it should carry) and the system's rule (`SystemConfig.routing`).
Out: the chosen endpoint id, or None when all are full (the request waits at the router).
Rules:
- `least-loaded` (spread): least outstanding per unit of speed (join-the-shortest-queue
  weighted by speed, so a slower execution pipeline gets proportionally fewer requests),
  ties to the lowest id.
- `pack` (FlexPipe §7, "automatically reclaims resources when requests subside"): the
  busiest endpoint still under its `target` (the autoscaler's per-endpoint target, so the
  pool runs on the fewest endpoints and the surplus ones go idle and are released by the
  autoscaler's downscale), ties to the lowest id; when every endpoint is at its target,
  `least-loaded` among those with room.
Pure and deterministic; `surge serve`'s server and the simulator both call `route`.
"""

from collections.abc import Sequence
from dataclasses import dataclass

ROUTINGS = ("least-loaded", "pack")
"""The routing rules `route` knows."""


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
    target: float | None = None
    """Requests it should carry (the autoscaler's target for it); `pack` fills endpoints up
    to this first. None: no target (`pack` treats it as full to its target)."""


def route(endpoints: Sequence[Endpoint], routing: str = "least-loaded") -> int | None:
    """The endpoint for the next request under `routing` (one of `ROUTINGS`), or None if
    none has room."""
    if routing == "pack":
        packed = _busiest_under_target(endpoints)
        if packed is not None:
            return packed
    best: tuple[float, int] | None = None
    for e in endpoints:
        if e.outstanding >= e.max_outstanding:
            continue
        score = ((e.outstanding + 1) / e.speed, e.endpoint_id)
        if best is None or score < best:
            best = score
    return None if best is None else best[1]


def _busiest_under_target(endpoints: Sequence[Endpoint]) -> int | None:
    best: tuple[float, int] | None = None
    for e in endpoints:
        if e.target is None or e.outstanding >= min(e.target, e.max_outstanding):
            continue
        score = (-e.outstanding / e.speed, e.endpoint_id)
        if best is None or score < best:
            best = score
    return None if best is None else best[1]
