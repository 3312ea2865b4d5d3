"""BlitzScale zigzag scheduling (§5.2, Eq. 1): which layers of each batch run where.

While a new instance (the *target*, inst.1) loads a model layer by layer, an overloaded
instance that holds it all (the *source*, inst.0) shares its queued batches with it.
Batch i runs its first T_i layers on the target and the remaining S_i on the source.

In: a `ZigzagProblem` (L layers, the load ratio Time_l = time to load one layer divided
by the time to execute one layer, N equal batches). Out: a `ZigzagSchedule` with one
split (T_i, S_i) per batch and the average latency, in units of one layer's execution
time as in the paper, from either

- `solve_zigzag`: the ILP of Eq. 1 solved with HiGHS (`scipy.optimize.milp`), or
- `best_effort`: the paper's baseline, as many layers on the target as are loaded,
  never more than half.

The model (Eq. 1), with every batch FIFO on the source:
  Latency_avg = (Σ_{req=1..N} Σ_{i=1..req} S_i) / N
  C1  S_i + T_i = L                                 pipeline limit
  C2  Σ_{j≤i} T_j ≤ Σ_{j<i} S_j           (i > 1)    target finishes i before the
                                                     source starts it
  C3  Time_l · (T_i − k0) ≤ Σ_{j<i} T_j   (all i)    T_i layers are loaded when the
                                                     target starts batch i
Deviation, documented: the paper writes C3 as Time_l · T_i ≤ Σ_{j<i} T_j for i > 1 and
leaves T_1 open. Read literally that lets batch 1 run every layer on the target, and
for Time_l > 1 forbids the target any layer after batch 1. The clock in C2/C3 starts
when the target's first layer has landed (Fig. 12: "the execution starts when the first
layer has been loaded"), so k0 = `resident_layers_at_start` layers (default 1) are
already there; with k0 = 0 the inequality is the paper's literal C3. Written for all i,
C3 bounds T_1 by k0, which gives Fig. 12's (1, 6) for the first batch.
"""

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from surge.errors import SurgeError

CHECK_TOLERANCE = 1e-9
"""Slack allowed when checking C2/C3 in floating point (Time_l may be fractional)."""


@dataclass(frozen=True)
class ZigzagProblem:
    """One live-autoscaling episode. Validated once at construction."""

    num_layers: int
    """L, layers of the model (>= 1); 32 for Llama2-7B."""
    load_ratio: float
    """Time_l: time to load one layer onto the target / time to execute one layer (> 0).
    Fig. 12 uses 6 (Llama2-7B, 2000 prefill tokens per batch, 200 Gb/s RDMA)."""
    num_batches: int
    """N, equal-sized request batches executed while the target loads (>= 1)."""
    resident_layers_at_start: int = 1
    """k0, layers already on the target when scheduling starts (0 <= k0 <= L)."""

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise SurgeError(f"layers must be >= 1 (got {self.num_layers})")
        if self.num_batches < 1:
            raise SurgeError(f"batches must be >= 1 (got {self.num_batches})")
        if not (math.isfinite(self.load_ratio) and self.load_ratio > 0):
            raise SurgeError(
                f"load ratio must be a finite number > 0: the time to load one layer over "
                f"the time to execute one (got {self.load_ratio})"
            )
        if not 0 <= self.resident_layers_at_start <= self.num_layers:
            raise SurgeError(
                f"resident layers at start must be in 0..{self.num_layers} "
                f"(got {self.resident_layers_at_start})"
            )


@dataclass(frozen=True)
class ZigzagSchedule:
    """Splits (T_i, S_i) for batches 1..N and their average latency (layer-execution units)."""

    policy: str
    """"zigzag" (the ILP) or "best_effort"."""
    splits: tuple[tuple[int, int], ...]
    """(T_i, S_i): layers of batch i on the target, then on the source."""
    avg_latency: float
    """Eq. 1's Latency_avg of `splits`."""


def batch_latencies(splits: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """Latency of each batch: when the source finishes it, Σ_{j≤i} S_j (Eq. 1)."""
    out: list[int] = []
    total = 0
    for _, s in splits:
        total += s
        out.append(total)
    return tuple(out)


def average_latency(splits: tuple[tuple[int, int], ...]) -> float:
    """Eq. 1's objective: the mean of `batch_latencies`."""
    return sum(batch_latencies(splits)) / len(splits)


def violations(problem: ZigzagProblem, splits: tuple[tuple[int, int], ...]) -> list[str]:
    """Every way `splits` breaks C1-C3 (or the shape); empty when it is feasible."""
    out: list[str] = []
    if len(splits) != problem.num_batches:
        return [f"{len(splits)} splits for {problem.num_batches} batches"]
    sum_t = sum_s = 0
    for i, (t, s) in enumerate(splits, start=1):
        if t < 0 or s < 0:
            out.append(f"batch {i}: negative split ({t}, {s})")
        if t + s != problem.num_layers:
            out.append(f"C1 batch {i}: {t} + {s} != {problem.num_layers}")
        if i > 1 and sum_t + t > sum_s + CHECK_TOLERANCE:
            out.append(f"C2 batch {i}: target done at {sum_t + t} > source start {sum_s}")
        need = problem.load_ratio * (t - problem.resident_layers_at_start)
        if need > sum_t + CHECK_TOLERANCE:
            out.append(f"C3 batch {i}: {t} layers loaded at {need:g} > target start {sum_t}")
        sum_t += t
        sum_s += s
    return out


def _schedule(problem: ZigzagProblem, policy: str, targets: list[int]) -> ZigzagSchedule:
    splits = tuple((t, problem.num_layers - t) for t in targets)
    broken = violations(problem, splits)
    if broken:  # a bug in this module, never user error
        raise AssertionError(f"{policy} schedule breaks Eq. 1: {broken[0]}")
    return ZigzagSchedule(policy=policy, splits=splits, avg_latency=average_latency(splits))


def _max_loaded(problem: ZigzagProblem, target_start: int) -> int:
    """Largest T with Time_l · (T − k0) <= target_start (C3), at most L."""
    extra = math.floor(target_start / problem.load_ratio + CHECK_TOLERANCE)
    return min(problem.num_layers, problem.resident_layers_at_start + extra)


def best_effort(problem: ZigzagProblem) -> ZigzagSchedule:
    """The paper's baseline: each batch, in order, runs as many layers on the target as
    are loaded when it gets there (C3), at most half the model, and no more than lets the
    target finish before the source starts the batch (C2)."""
    half = problem.num_layers // 2
    targets: list[int] = []
    sum_t = sum_s = 0
    for i in range(problem.num_batches):
        t = min(half, _max_loaded(problem, sum_t))
        if i > 0:
            t = min(t, sum_s - sum_t)
        targets.append(t)
        sum_t += t
        sum_s += problem.num_layers - t
    return _schedule(problem, "best_effort", targets)


def milp_solver() -> tuple[Any, Any, Any]:
    """HiGHS through scipy: (`Bounds`, `LinearConstraint`, `milp`). Imported here, not at the
    top: `scipy.optimize` takes 0.8-1.1 s of CPU to import (`python -X importtime`, a
    process that already holds numpy; ~4 s measured on a loaded machine), which only a solve
    should pay, not `surge plan`. The serving body imports it ahead of the first live look
    (`runtime/scaleout/ilp_warmup.warm_solver`), so no user's scale-out waits for it."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    return Bounds, LinearConstraint, milp


def solve_zigzag(problem: ZigzagProblem) -> ZigzagSchedule:
    """The schedule minimising Eq. 1's average latency under C1-C3, by HiGHS.

    Variables x = (T_1..T_N, S_1..S_N), integers in 0..L. Objective weights: S_i appears in
    the latency of batches i..N, so its coefficient is (N − i + 1) / N.
    """
    Bounds, LinearConstraint, milp = milp_solver()
    n, num_layers = problem.num_batches, problem.num_layers
    ratio, k0 = problem.load_ratio, problem.resident_layers_at_start
    cost = np.concatenate([np.zeros(n), (n - np.arange(n)) / n])
    rows: list[np.ndarray] = []
    lower: list[float] = []
    upper: list[float] = []
    for i in range(n):
        c1 = np.zeros(2 * n)
        c1[i] = c1[n + i] = 1.0
        rows.append(c1)
        lower.append(num_layers)
        upper.append(num_layers)
        if i > 0:
            c2 = np.zeros(2 * n)
            c2[: i + 1] = 1.0  # Σ_{j≤i} T_j
            c2[n : n + i] = -1.0  # − Σ_{j<i} S_j
            rows.append(c2)
            lower.append(-np.inf)
            upper.append(0.0)
        c3 = np.zeros(2 * n)
        c3[i] = ratio
        c3[:i] -= 1.0  # Time_l · T_i − Σ_{j<i} T_j <= Time_l · k0
        rows.append(c3)
        lower.append(-np.inf)
        upper.append(ratio * k0)
    result = milp(
        cost,
        constraints=LinearConstraint(np.array(rows), np.array(lower), np.array(upper)),
        integrality=np.ones(2 * n),
        bounds=Bounds(0, num_layers),
    )
    if result.x is None:  # best-effort is always feasible, so the ILP is too
        raise AssertionError(f"HiGHS found no zigzag schedule: {result.message}")
    targets = [round(v) for v in result.x[:n]]
    return _schedule(problem, "zigzag", targets)
