"""ParaServe worker scaling after a cold start (§6.1): scale down or scale up.

After a pipeline group has served its first tokens, ParaServe either *scales down* (one
worker fetches the rest of the model, the requests' KV caches migrate to it, the others
stop) or *scales up* (every worker fetches the rest and becomes a standalone endpoint).
It decides with a sliding window: the requests that arrived during the past window are
the predicted maximum for the next one; with the queue they give the number of workers
to keep. A burst bigger than one group starts several groups (Fig. 7: 30 workers as
groups of four and one of two).

In: arrival times (seconds, any order), the current time and queue length, the group's
pipeline size, `PredictorSettings`. Out: a `ConsolidationDecision`. `consolidate_group` is
the call both bodies make for a group that has served (`runtime/scaleout/paraserve.py`,
`sim/consolidation.py`): the predictor's settings from the system, the decision, and how
many members become instances; `tests/parity/test_consolidation_parity.py` proves they
agree.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from surge.errors import SurgeError
from surge.policy.systems import SystemConfig


@dataclass(frozen=True)
class PredictorSettings:
    """Knobs of the §6.1 sliding-window predictor. Validated once at construction."""

    window_s: float = 60.0
    """Length of the sliding window (s, > 0): past arrivals in it predict the next one's."""
    requests_per_worker: int = 1
    """Requests one standalone worker serves at once within the SLO (>= 1); Fig. 7
    assumes one request per second per worker."""
    max_pipeline_size: int = 4
    """Largest pipeline group (§4.1.2 caps s at 4); bigger bursts start more groups."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise SurgeError(f"window_s must be > 0 (got {self.window_s})")
        if self.requests_per_worker < 1:
            raise SurgeError(f"requests_per_worker must be >= 1 (got {self.requests_per_worker})")
        if self.max_pipeline_size < 1:
            raise SurgeError(f"max_pipeline_size must be >= 1 (got {self.max_pipeline_size})")


@dataclass(frozen=True)
class PipelineGroup:
    """One pipeline group started for a cold start and what it becomes."""

    num_workers: int
    """Workers in the group (its pipeline size)."""
    num_workers_to_keep: int
    """Workers that fetch the whole model and stay as standalone workers (1..num_workers)."""


@dataclass(frozen=True)
class ConsolidationDecision:
    """What to do with cold-start workers once they have loaded their parts."""

    mode: Literal["scale_down", "scale_up"]
    """scale_down: keep one worker per group; scale_up: keep several as endpoints."""
    num_workers_to_keep: int
    """Standalone workers wanted after consolidation (>= 1)."""
    predicted_arrivals: int
    """Requests expected in the next window (= arrivals in the past window)."""
    groups: tuple[PipelineGroup, ...]
    """Pipeline groups to create for this cold start."""


def predicted_arrivals(arrival_times_s: Iterable[float], now_s: float, window_s: float) -> int:
    """Arrivals in (now − window, now]: the prediction for the next window (§6.1)."""
    return sum(1 for t in arrival_times_s if now_s - window_s < t <= now_s)


def required_workers(queue_length: int, num_predicted: int, requests_per_worker: int) -> int:
    """Workers needed for the queue plus the predicted arrivals, at least one."""
    return max(1, -(-(queue_length + num_predicted) // requests_per_worker))


def plan_groups(
    num_workers_wanted: int, pipeline_size: int, max_pipeline_size: int
) -> tuple[PipelineGroup, ...]:
    """Groups no smaller than what they must become: full groups of max(s, max size), and
    one more for the remainder (never smaller than s, the size that met the SLOs)."""
    if num_workers_wanted == 1:
        return (PipelineGroup(pipeline_size, 1),)
    size = max(pipeline_size, max_pipeline_size)
    groups = [PipelineGroup(size, size)] * (num_workers_wanted // size)
    remainder = num_workers_wanted % size
    if remainder:
        groups.append(PipelineGroup(max(remainder, pipeline_size), remainder))
    return tuple(groups)


def decide_consolidation(
    arrival_times_s: Iterable[float],
    now_s: float,
    queue_length: int,
    pipeline_size: int,
    settings: PredictorSettings,
) -> ConsolidationDecision:
    """§6.1: scale down (the default) unless the queue plus the past window's arrivals need
    more than one worker; then scale up to that many, over as many groups as it takes."""
    if queue_length < 0 or pipeline_size < 1:
        raise SurgeError("queue_length must be >= 0 and pipeline_size >= 1")
    num_predicted = predicted_arrivals(arrival_times_s, now_s, settings.window_s)
    wanted = required_workers(queue_length, num_predicted, settings.requests_per_worker)
    return ConsolidationDecision(
        mode="scale_down" if wanted == 1 else "scale_up",
        num_workers_to_keep=wanted,
        predicted_arrivals=num_predicted,
        groups=plan_groups(wanted, pipeline_size, settings.max_pipeline_size),
    )


def predictor_settings(system: SystemConfig) -> PredictorSettings:
    """The §6.1 predictor of `system`: its window, its largest group, and a worker serving
    the system's per-instance concurrency target (`autoscale.target_ongoing_requests`)."""
    return PredictorSettings(
        window_s=system.predictor_window_s,
        requests_per_worker=max(1, round(system.autoscale.target_ongoing_requests)),
        max_pipeline_size=system.pipeline_size,
    )


@dataclass(frozen=True)
class GroupConsolidation:
    """What becomes of a pipeline group of `size` workers once it has served."""

    decision: ConsolidationDecision
    keep: int
    """Members that fetch the rest and become instances (the first `keep`, 1..size)."""


def consolidate_group(
    system: SystemConfig,
    arrival_times_s: Iterable[float],
    now_s: float,
    queue_length: int,
    size: int,
) -> GroupConsolidation:
    """§6.1 for a group of `size` workers: the predictor's decision (`predictor_settings`)
    and the members kept — the decision's workers (one on a scale-down) with
    `consolidation` `predictor`, every member otherwise (`scale-up`)."""
    decision = decide_consolidation(
        arrival_times_s, now_s, queue_length, size, predictor_settings(system)
    )
    keep = size
    if system.consolidation == "predictor":
        keep = min(size, decision.num_workers_to_keep)
    return GroupConsolidation(decision, keep)
