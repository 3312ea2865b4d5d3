"""FlexPipe granularity decisions (§6.1 Eq. 4/5, §7 Eq. 11/12).

In: arrival times (seconds) over a window, the candidate granularities with their
profiled throughput and latency, the queue, and config dataclasses holding every
constant of the equations. Out:
- `cv_of_arrivals`: ν_t, the coefficient of variation of inter-arrival times (§6);
- `granularity_scores` / `update_granularity`: Eq. 4's score of each candidate and the
  chosen one, with a smoothed CV and a switching margin (hysteresis) so that a noisy but
  stationary signal does not flip the choice back and forth (the paper's Alg. 1 switches
  on any change of argmax; the smoothing and margin are ours, documented fields);
- `instances_per_granularity`: Eq. 5, M(g_k) = ⌊μ_total / μ_k⌋, μ_k = T_k/(β1 + β2 η_k);
- `scaling_granularity` (Eq. 11) and `meets_scaling_slo` (Eq. 12), combined in
  `choose_scaling_granularity`: the sigmoid's m_j, made finer until Eq. 12 holds.
"""

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from surge.errors import SurgeError


def cv_of_arrivals(arrival_times_s: Sequence[float]) -> float:
    """ν = σ/μ of the inter-arrival times (population σ); 0 with fewer than 3 arrivals or
    a zero mean gap."""
    times = sorted(arrival_times_s)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if len(gaps) < 2:
        return 0.0
    mean = sum(gaps) / len(gaps)
    if mean <= 0:
        return 0.0
    var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    return math.sqrt(var) / mean


@dataclass(frozen=True)
class GranularityCandidate:
    """g_k = (η_k, b_k) with its profile (§6)."""

    num_stages: int
    """η_k, pipeline stages (>= 1)."""
    batch_size: int
    """b_k, micro-batch size (>= 1)."""
    throughput_rps: float
    """T_k, profiled throughput of one instance (requests/s, > 0)."""
    latency_s: float
    """L_k, profiled latency (s, > 0)."""
    cv_target: float
    """ν_k, the request CV this granularity suits best (>= 0): low for coarse, high for fine."""

    def __post_init__(self) -> None:
        if self.num_stages < 1 or self.batch_size < 1:
            raise SurgeError("num_stages and batch_size must be >= 1")
        if not (self.throughput_rps > 0 and self.latency_s > 0 and self.cv_target >= 0):
            raise SurgeError("throughput and latency must be > 0 and cv_target >= 0")


@dataclass(frozen=True)
class GranularitySettings:
    """Constants of Eq. 4 and of our hysteresis. Validated once at construction."""

    throughput_weight: float = 0.5
    """α of Eq. 4 in [0, 1]: weight of normalised throughput against normalised latency."""
    cv_sensitivity: float = 1.0
    """σ of Eq. 4 (> 0): how fast a candidate's score falls as ν_t leaves its ν_k."""
    cv_smoothing: float = 0.2
    """Weight (0, 1] of a new CV sample in the exponentially smoothed ν_t (1 = no smoothing).
    Ours, not the paper's: damps window-to-window noise."""
    switch_margin: float = 0.3
    """Hysteresis (>= 0): switch only when the best score beats the current one's by this
    fraction. Ours, not the paper's."""

    def __post_init__(self) -> None:
        if not 0 <= self.throughput_weight <= 1:
            raise SurgeError("throughput_weight must be in [0, 1]")
        if not self.cv_sensitivity > 0:
            raise SurgeError("cv_sensitivity must be > 0")
        if not 0 < self.cv_smoothing <= 1:
            raise SurgeError("cv_smoothing must be in (0, 1]")
        if not self.switch_margin >= 0:
            raise SurgeError("switch_margin must be >= 0")


@dataclass(frozen=True)
class GranularityState:
    """What the granularity controller remembers between decisions."""

    smoothed_cv: float | None = None
    """ν_t after smoothing; None before the first sample."""
    current: int | None = None
    """Index of the granularity in use; None before the first decision."""


def granularity_scores(
    candidates: Sequence[GranularityCandidate], cv: float, settings: GranularitySettings
) -> tuple[float, ...]:
    """Eq. 4: [α T_k/T_max + (1 − α) L_min/L_k] · exp(−|ν_t − ν_k| / σ) for each candidate."""
    if not candidates:
        raise SurgeError("give at least one granularity candidate")
    t_max = max(c.throughput_rps for c in candidates)
    l_min = min(c.latency_s for c in candidates)
    a = settings.throughput_weight
    return tuple(
        (a * c.throughput_rps / t_max + (1 - a) * l_min / c.latency_s)
        * math.exp(-abs(cv - c.cv_target) / settings.cv_sensitivity)
        for c in candidates
    )


def update_granularity(
    candidates: Sequence[GranularityCandidate],
    state: GranularityState,
    cv_sample: float,
    settings: GranularitySettings,
) -> GranularityState:
    """One decision interval: smooth ν_t, score (Eq. 4), keep the current granularity unless
    the argmax beats it by `switch_margin`. Ties go to the coarser (earlier listed) one."""
    if not cv_sample >= 0:
        raise SurgeError(f"a CV sample must be >= 0 (got {cv_sample})")
    w = settings.cv_smoothing
    cv = cv_sample if state.smoothed_cv is None else w * cv_sample + (1 - w) * state.smoothed_cv
    scores = granularity_scores(candidates, cv, settings)
    best = max(range(len(scores)), key=lambda k: (scores[k], -k))
    current = state.current
    if current is None or scores[best] > scores[current] * (1 + settings.switch_margin):
        current = best
    return GranularityState(smoothed_cv=cv, current=current)


def instances_per_granularity(
    total_capacity_rps: float,
    candidate: GranularityCandidate,
    fixed_overhead: float,
    per_stage_overhead: float,
) -> int:
    """Eq. 5: ⌊μ_total / μ_k⌋ with μ_k = T_k / (β1 + β2 η_k); β1 = `fixed_overhead`,
    β2 = `per_stage_overhead` (coordination cost per stage), β1 + β2 η_k > 0."""
    divisor = fixed_overhead + per_stage_overhead * candidate.num_stages
    if not divisor > 0 or total_capacity_rps < 0:
        raise SurgeError("need β1 + β2·η > 0 and a total capacity >= 0")
    return math.floor(total_capacity_rps / (candidate.throughput_rps / divisor) + 1e-9)


@dataclass(frozen=True)
class ScalingSettings:
    """Constants of Eq. 11/12 (§7). Validated once at construction."""

    max_granularity: int = 8
    """G_max, the finest scaling granularity (stages per scaled instance, >= 1)."""
    sigmoid_offset: float = 3.0
    """β of Eq. 11 (> 0): with cv·q̂ = 0, m = ⌊G_max / (1 + β)⌋."""
    sigmoid_steepness: float = 2.0
    """γ of Eq. 11 (> 0): how fast m rises towards G_max as cv·q̂ grows."""
    max_queue_length: int = 64
    """Q_max, the queue length at which q̂ = min(q / Q_max, 1) saturates (>= 1)."""

    def __post_init__(self) -> None:
        if self.max_granularity < 1 or self.max_queue_length < 1:
            raise SurgeError("max_granularity and max_queue_length must be >= 1")
        if not (self.sigmoid_offset > 0 and self.sigmoid_steepness > 0):
            raise SurgeError("sigmoid_offset (β) and sigmoid_steepness (γ) must be > 0")


def scaling_granularity(cv: float, queue_length: int, settings: ScalingSettings) -> int:
    """Eq. 11: m_j = ⌊G_max / (1 + β e^{−γ cv q̂})⌋, at least 1."""
    q_hat = min(queue_length / settings.max_queue_length, 1.0)
    denom = 1.0 + settings.sigmoid_offset * math.exp(-settings.sigmoid_steepness * cv * q_hat)
    return max(1, math.floor(settings.max_granularity / denom))


def meets_scaling_slo(
    deadline_s: float,
    init_s: float,
    stage_throughputs_rps: Sequence[float],
    queue_length: int,
    num_requests: int,
) -> bool:
    """Eq. 12: (T_j − S_j) Σ_k μ_jk / Q_j >= r_j; an empty queue counts as Q_j = 1."""
    capacity = (deadline_s - init_s) * sum(stage_throughputs_rps)
    return capacity / max(queue_length, 1) >= num_requests


@dataclass(frozen=True)
class ScalingDecision:
    """The scaling granularity chosen for one workload."""

    num_stages: int
    """m_j, stages of the scaled-out instance."""
    sigmoid_num_stages: int
    """What Eq. 11 alone gave."""
    meets_slo: bool
    """Eq. 12 holds at `num_stages` (False only when even G_max misses it)."""


def choose_scaling_granularity(
    cv: float,
    queue_length: int,
    deadline_s: float,
    fixed_init_s: float,
    model_load_s: float,
    stage_throughput_rps: float,
    num_requests: int,
    settings: ScalingSettings,
    max_start: int | None = None,
) -> ScalingDecision:
    """Eq. 11's m_j (at most `max_start`, when given), then the smallest m >= that up to
    G_max meeting Eq. 12, where an m-stage scale-out starts in S_j(m) = fixed_init_s +
    model_load_s / m (each stage loads 1/m of the model in parallel) and its m expanded
    stages give μ_jk = stage_throughput_rps each."""
    start = min(scaling_granularity(cv, queue_length, settings), settings.max_granularity)
    if max_start is not None:
        start = max(1, min(start, max_start))
    for m in range(start, settings.max_granularity + 1):
        init_s = fixed_init_s + model_load_s / m
        if meets_scaling_slo(
            deadline_s, init_s, [stage_throughput_rps] * m, queue_length, num_requests
        ):
            return ScalingDecision(num_stages=m, sigmoid_num_stages=start, meets_slo=True)
    return ScalingDecision(
        num_stages=settings.max_granularity, sigmoid_num_stages=start, meets_slo=False
    )
