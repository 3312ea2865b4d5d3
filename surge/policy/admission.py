"""Admission under overload: when a request is refused at once, when a held one gives up,
what `Retry-After` says, and how many instances a deployment may ask for.

Pure decisions (frozen data in, answers out; no clock, no sockets). `surge serve` carries
them out in `control/admission.py`: a request that no instance has room for waits in its
deployment's hold queue (the router's FIFO, `runtime/server.py`) — for a free instance, or
for a scale-out from zero. The queue is bounded (`max_queued_requests`: past it the request
is refused with HTTP 429) and so is the wait (`hold_timeout_s`: past it the request ends
with HTTP 503); both answers carry `Retry-After`.
"""

import math
from dataclasses import dataclass

from surge.errors import SurgeError

DEFAULT_MAX_QUEUED_REQUESTS = 256
"""Requests one deployment holds while no instance has room (4 x the default batch of 64)."""
DEFAULT_HOLD_TIMEOUT_S = 60.0
"""How long a request may wait for an instance (a cold start from the registry included)."""
QUEUE_FULL_RETRY_AFTER_S = 1
"""`Retry-After` of a 429: the queue drains at serving speed, so a second is enough to
find room or be told again cheaply."""
MAX_RETRY_AFTER_S = 60
"""The longest `Retry-After` surge ever suggests."""


@dataclass(frozen=True)
class AdmissionSettings:
    """A deployment's overload knobs (its spec's `admission` object)."""

    max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS
    """Requests held at once; one more is refused with 429 (>= 1: a request reaching a
    deployment at zero must be held while it scales out)."""
    hold_timeout_s: float = DEFAULT_HOLD_TIMEOUT_S
    """A request held this long without a first token ends with 503."""

    def __post_init__(self) -> None:
        if isinstance(self.max_queued_requests, bool) or not isinstance(
            self.max_queued_requests, int
        ):
            raise SurgeError(
                f"max_queued_requests must be an integer (got {self.max_queued_requests!r})"
            )
        if self.max_queued_requests < 1:
            raise SurgeError(f"max_queued_requests must be >= 1 (got {self.max_queued_requests})")
        t = self.hold_timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise SurgeError(f"hold_timeout_s must be a number > 0 (got {t!r})")


@dataclass(frozen=True)
class Refusal:
    """Why a request is not (or no longer) admitted, and when to try again."""

    status: int
    """HTTP status: 429 (the hold queue is full) or 503 (held past the timeout)."""
    reason: str
    """One line for the client."""
    retry_after_s: int
    """Whole seconds for the `Retry-After` header."""


def admit(num_held: int, settings: AdmissionSettings) -> Refusal | None:
    """None when a new request may join the hold queue that holds `num_held` now; else a
    429 refusal (the bound is on requests waiting, not on those running)."""
    if num_held < settings.max_queued_requests:
        return None
    return Refusal(
        429,
        f"too many requests: {num_held} already wait for an instance "
        f"(max_queued_requests {settings.max_queued_requests}); retry later",
        QUEUE_FULL_RETRY_AFTER_S,
    )


def hold_expired(held_s: float, has_output: bool, settings: AdmissionSettings) -> Refusal | None:
    """A 503 refusal when a request has waited `held_s` seconds without a first token past
    the hold timeout; None otherwise. A request that has produced tokens never expires (it
    was moved to another instance and continues: its client is already streaming)."""
    if has_output or held_s < settings.hold_timeout_s:
        return None
    return Refusal(
        503,
        f"no instance could take the request within hold_timeout_s "
        f"{settings.hold_timeout_s:g} s (every slot busy or the model still loading); "
        "retry later",
        # Nothing freed a slot within a whole hold timeout: retrying sooner rarely helps.
        min(MAX_RETRY_AFTER_S, max(1, math.ceil(settings.hold_timeout_s))),
    )


def instance_capacity(nodes: int, slots_per_node: int) -> int:
    """Most instances one deployment can run: a node runs at most one instance of a model
    (placement skips nodes that hold one), and only if it has a slot."""
    return nodes if slots_per_node >= 1 else 0


def check_min_replicas(min_replicas: int, nodes: int, slots_per_node: int) -> None:
    """Refuse a `min_replicas` the cluster can never hold, stating its capacity."""
    cap = instance_capacity(nodes, slots_per_node)
    if min_replicas > cap:
        raise SurgeError(
            f"min_replicas {min_replicas} exceeds the cluster's capacity: {nodes} nodes x "
            f"{slots_per_node} slots per node, at most one instance of a deployment per node, "
            f"so at most {cap} instances; ask for min_replicas <= {cap}"
        )
