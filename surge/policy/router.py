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
  autoscaler's downscale), the ones with the fewest pipeline stages first (§6.1 Eq. 5's
  multi-granular pool: coarse pipelines carry the load with the fewest hops, finer ones
  take the overflow and are the first to go idle), ties to the lowest id. When every
  endpoint is at its target: the least loaded per unit of throughput (speed x stages: a
  pipeline of η stages keeps η micro-batches in flight, §7 Eq. 12) among those under
  `PACK_MAX_OVER_TARGET` x their target. Past that the request waits at the router, where
  it counts for a scale-out, rather than queueing behind an overfull endpoint's prefills.
Pure and deterministic; `surge serve`'s server and the simulator both call `route`.
"""

from collections.abc import Sequence
from dataclasses import dataclass

ROUTINGS = ("least-loaded", "pack")
"""The routing rules `route` knows."""
PACK_MAX_OVER_TARGET = 1.5
"""`pack` sends an endpoint at most this many times its target (ours). Measured in the
simulator (§9 set-up, llama2-7b, CV 8): a one-stage pipeline filled to its batch limit of
64 in a burst runs the burst's prefills one after another, so the last requests waited
seconds for their first token (e2e p99 5.6 s); capped, they waited at the router for a new
pipeline instead (p99 2.9 s)."""


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
    num_stages: int = 1
    """Pipeline stages working on requests at once (micro-batches in flight; 1 for an
    instance); `pack` fills the endpoints with the fewest first."""


def route(endpoints: Sequence[Endpoint], routing: str = "least-loaded") -> int | None:
    """The endpoint for the next request under `routing` (one of `ROUTINGS`), or None if
    none has room."""
    if routing == "pack":
        packed = _busiest_under_target(endpoints)
        if packed is not None:
            return packed
    best: tuple[float, int] | None = None
    pack = routing == "pack"
    for e in endpoints:  # every endpoint at every routing decision: `_room` only to pack
        if e.outstanding >= (_room(e, routing) if pack else e.max_outstanding):
            continue
        throughput = e.speed * (e.num_stages if pack else 1)
        score = ((e.outstanding + 1) / throughput, e.endpoint_id)
        if best is None or score < best:
            best = score
    return None if best is None else best[1]


def _room(e: Endpoint, routing: str) -> float:
    """The most requests `routing` sends `e`."""
    if routing == "pack" and e.target is not None:
        return min(e.max_outstanding, PACK_MAX_OVER_TARGET * e.target)
    return e.max_outstanding


def _busiest_under_target(endpoints: Sequence[Endpoint]) -> int | None:
    best: tuple[int, float, int] | None = None
    for e in endpoints:
        if e.target is None or e.outstanding >= min(e.target, e.max_outstanding):
            continue
        score = (e.num_stages, -e.outstanding / e.speed, e.endpoint_id)
        if best is None or score < best:
            best = score
    return None if best is None else best[2]
