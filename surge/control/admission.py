"""The hold queue under overload: refuse at once past its bound, end requests held too long.

What flows: a deployment and its router's FIFO queue (`runtime/server.py`: the requests no
instance has room for, including those waiting for a scale-out from zero) in; the answers
of `surge.policy.admission` carried out: `check` raises `Overloaded` (HTTP 429 with
`Retry-After`) before a request is queued; `expire`, run every tick by the controller, ends
each request held past its deployment's `hold_timeout_s` with `Unavailable` (HTTP 503 with
`Retry-After`) and takes it off the queue and the deployment, so nothing stays ongoing and
the deployment can still scale to zero. Refusals are counted in /metrics. Owned by control/.
"""

import logging

from surge.control.metrics import Metrics
from surge.control.state import Deployment, TrackedRequest
from surge.errors import Overloaded, Unavailable
from surge.policy.admission import admit, hold_expired
from surge.runtime.request import ServeRequest

log = logging.getLogger(__name__)


def check(dep: Deployment, metrics: Metrics) -> None:
    """Raise `Overloaded` (429) when the deployment's hold queue is full, or `Unavailable`
    (503, no retry: it must be redeployed) when the deployment has failed."""
    if dep.failure is not None:
        raise Unavailable(f"deployment {dep.name!r} has failed: {dep.failure}")
    refusal = admit(len(dep.server.queue), dep.spec.admission)
    if refusal is not None:
        metrics.refused.labels(dep.name, str(refusal.status)).inc()
        raise Overloaded(refusal.reason, retry_after_s=refusal.retry_after_s)


def expire(dep: Deployment, now_s: float, metrics: Metrics) -> int:
    """End the requests held past the deployment's hold timeout (503); how many ended."""
    ended = 0
    for req in list(dep.server.queue):
        if req.done.is_set():
            continue
        refusal = hold_expired(
            now_s - req.arrival_t, bool(req.output_token_ids), dep.spec.admission
        )
        if refusal is None:
            continue
        drop(dep, req)
        if isinstance(req, TrackedRequest):
            req.refuse(Unavailable(refusal.reason, retry_after_s=refusal.retry_after_s))
        else:
            req.finish_reason = "error"
            req.done.set()
        metrics.refused.labels(dep.name, str(refusal.status)).inc()
        ended += 1
    if ended:
        log.info("%s: %d request(s) held past hold_timeout_s answered 503", dep.name, ended)
    return ended


def drop(dep: Deployment, req: ServeRequest) -> None:
    """Take a request off the deployment's queue and books (it holds nothing after)."""
    dep.server.drop(req)
    dep.server.requests.pop(req.req_id, None)
