"""Autoscaler: how many instances a model (or one role of it) should have now.

In: a `PoolLoad` (requests waiting at the router and, per instance, its outstanding
requests, whether it is still loading, and since when it has been idle) and
`AutoscaleSettings`. Out: a `ScaleDecision`: how many instances to add and which idle
instances to release.

Rule (a concurrency target, as Knative and the papers' load monitors use):
desired = ceil(outstanding / target_outstanding_per_instance), at least 1 while any
request is outstanding, within [min_instances, max_instances]. Instances still loading
count as capacity, so a slow load is not answered by ever more scale-outs unless the
backlog keeps growing (the over-provisioning BlitzScale §6.2 observes for ServerlessLLM
comes from the backlog, not from the rule). An instance is released once it has been
idle for `scale_down_delay_s` (BlitzScale §4: 2 s; ServerlessLLM / λScale: keep-alive)
and the pool stays at >= desired; the longest-idle go first (ties: lowest id).
Pure and deterministic: no clock, the caller passes `now_s`.
"""

import math
from dataclasses import dataclass

from surge.errors import SurgeError


@dataclass(frozen=True)
class AutoscaleSettings:
    """Knobs of the autoscaler. Validated at construction."""

    target_outstanding_per_instance: float = 8.0
    """Requests in flight (queued + running) one instance should carry; > 0."""
    scale_down_delay_s: float = 2.0
    """An instance idle this long may be released (keep-alive); >= 0."""
    min_instances: int = 0
    """Instances kept even with no load (0 = scale to zero)."""
    max_instances: int | None = None
    """Most instances of the pool; None = as many as fit."""
    max_scale_out_per_decision: int | None = None
    """Most instances added by one decision; None = no limit."""

    def __post_init__(self) -> None:
        if not self.target_outstanding_per_instance > 0:
            raise SurgeError("target_outstanding_per_instance must be > 0")
        if self.scale_down_delay_s < 0:
            raise SurgeError("scale_down_delay_s must be >= 0")
        if self.min_instances < 0:
            raise SurgeError("min_instances must be >= 0")
        if self.max_instances is not None and self.max_instances < max(1, self.min_instances):
            raise SurgeError("max_instances must be >= max(1, min_instances)")
        if self.max_scale_out_per_decision is not None and self.max_scale_out_per_decision < 1:
            raise SurgeError("max_scale_out_per_decision must be >= 1 or None")


@dataclass(frozen=True)
class InstanceLoad:
    """One instance as the autoscaler sees it."""

    instance_id: int
    """Stable id (ties are broken by it)."""
    outstanding: int
    """Requests queued at or running on it."""
    loading: bool
    """True while its weights are still arriving."""
    idle_since_s: float | None
    """When it last became idle (no outstanding request); None if busy."""


@dataclass(frozen=True)
class PoolLoad:
    """The load of one pool (a model, or one role of it under P/D disaggregation)."""

    now_s: float
    """Current time, seconds."""
    queued: int
    """Requests waiting at the router for any instance."""
    instances: tuple[InstanceLoad, ...]
    """Every instance of the pool, loading or serving."""


@dataclass(frozen=True)
class ScaleDecision:
    """What to do now."""

    desired: int
    """Instances the pool should have."""
    scale_out: int
    """Instances to add."""
    release: tuple[int, ...]
    """Idle instances to release, in order."""


def desired_instances(outstanding: int, settings: AutoscaleSettings) -> int:
    """Instances needed for `outstanding` requests, within the settings' bounds."""
    want = math.ceil(outstanding / settings.target_outstanding_per_instance)
    if outstanding > 0:
        want = max(want, 1)
    want = max(want, settings.min_instances)
    if settings.max_instances is not None:
        want = min(want, settings.max_instances)
    return want


def decide(load: PoolLoad, settings: AutoscaleSettings) -> ScaleDecision:
    """The scale decision for `load` (see module docstring)."""
    outstanding = load.queued + sum(i.outstanding for i in load.instances)
    want = desired_instances(outstanding, settings)
    have = len(load.instances)
    out = max(0, want - have)
    if settings.max_scale_out_per_decision is not None:
        out = min(out, settings.max_scale_out_per_decision)
    release: list[int] = []
    if have > want:
        idle = sorted(
            (i.idle_since_s, i.instance_id)
            for i in load.instances
            if not i.loading
            and i.outstanding == 0
            and i.idle_since_s is not None
            and load.now_s - i.idle_since_s >= settings.scale_down_delay_s
        )
        release = [iid for _, iid in idle[: have - want]]
    return ScaleDecision(want, out, tuple(release))
