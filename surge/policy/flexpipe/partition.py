"""FlexPipe fine-grained model partitioning (§5, Eq. 2/3): cut a model into K stages.

In: per-operator profiles in execution order (compute time t_c, parameter bytes s_p,
activation bytes s_a handed to the next operator at the profiling batch size, and the
hierarchical block the operator belongs to, e.g. its transformer layer) and
`PartitionSettings` (K, inter-stage bandwidth B, per-slot memory M_GPU, regulariser
weight λ, target cycle C, batch sizes and α of Eq. 3).
Out: a `Partition`: K contiguous operator ranges minimising Eq. 2,

    Σ_k | t_c(S_k) + s_p(S_k)/B + s_a(S_k, b)/B − C | + λ · R(S_k)
    subject to s_p(S_k) <= M_GPU for every stage,

found exactly by dynamic programming over (stages used, operators covered), O(K n²).

Terms and deviations, documented:
- s_p(S_k)/B is Eq. 2's literal term: moving the stage's parameters over the inter-stage
  link, which is what a refactoring costs.
- s_a(S_k, b)/B is the activation the stage hands to the next one, scaled to the
  micro-batch size by Eq. 3, s_a(S, b) = s_a^base(S)(1 + α log(b / b_base)); the last
  stage hands nothing on. Eq. 2 names s_a among the profiles but not in its sum; without
  it Eq. 3 would have nothing to scale.
- R(S_k) = 1 when stage k ends inside a block (its last operator and the next one share a
  block), else 0: the regulariser favours cuts at block boundaries so finer stages can
  later be merged into coarser ones (§5).
- C defaults to the balanced cycle (Σ t_c + Σ s_p / B) / K when not given.
"""

import itertools
import math
from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.paraserve.sizing import transfer_s


@dataclass(frozen=True)
class OperatorProfile:
    """One operator (or layer) of the model, as profiled (§5)."""

    compute_s: float
    """t_c(v): execution time at the profiling batch size (s, >= 0)."""
    param_bytes: int
    """s_p(v): parameter bytes (>= 0)."""
    activation_bytes: int
    """s_a^base(v): bytes of its output at the profiling batch size (>= 0)."""
    block: int
    """Index of the hierarchical block (e.g. transformer layer) it belongs to;
    non-decreasing along the model."""


@dataclass(frozen=True)
class PartitionSettings:
    """The constants of Eq. 2/3. Validated once at construction."""

    num_stages: int
    """K, stages to cut the model into (>= 1)."""
    bandwidth_gbps: float
    """B, inter-stage bandwidth (Gbit/s, > 0)."""
    max_slot_memory_bytes: int
    """M_GPU, the most parameter bytes one slot may hold (> 0)."""
    boundary_penalty_s: float = 0.0
    """λ, the regularisation weight: cost of a cut inside a block (s, >= 0)."""
    target_cycle_s: float | None = None
    """C, the target computation-communication overlap cycle (s, > 0); None = balanced."""
    batch_size: int = 1
    """b, the micro-batch size served (>= 1)."""
    profiling_batch_size: int = 1
    """b_base, the batch size the activations were profiled at (>= 1)."""
    activation_growth: float = 0.0
    """α of Eq. 3: how activation bytes grow with log(b / b_base), learned by regression."""

    def __post_init__(self) -> None:
        if self.num_stages < 1:
            raise SurgeError(f"num_stages must be >= 1 (got {self.num_stages})")
        if not self.bandwidth_gbps > 0:
            raise SurgeError(f"bandwidth_gbps must be > 0 (got {self.bandwidth_gbps})")
        if self.max_slot_memory_bytes <= 0:
            raise SurgeError("max_slot_memory_bytes must be > 0")
        if not self.boundary_penalty_s >= 0:
            raise SurgeError("boundary_penalty_s must be >= 0")
        if self.target_cycle_s is not None and not self.target_cycle_s > 0:
            raise SurgeError("target_cycle_s must be > 0 or None")
        if self.batch_size < 1 or self.profiling_batch_size < 1:
            raise SurgeError("batch sizes must be >= 1")
        if activation_scale(self) < 0:
            raise SurgeError("activation_growth makes activations negative at this batch size")


@dataclass(frozen=True)
class Partition:
    """K contiguous stages of operators and what they cost."""

    bounds: tuple[tuple[int, int], ...]
    """Per stage, operators [start, end)."""
    stage_times_s: tuple[float, ...]
    """Per stage, t_c + s_p/B + s_a/B."""
    cost: float
    """Eq. 2's objective."""


def activation_scale(settings: PartitionSettings) -> float:
    """Eq. 3's factor 1 + α log(b / b_base)."""
    ratio = settings.batch_size / settings.profiling_batch_size
    return 1.0 + settings.activation_growth * math.log(ratio)


def _check_ops(ops: tuple[OperatorProfile, ...], settings: PartitionSettings) -> None:
    if not ops:
        raise SurgeError("the model has no operators to partition")
    if settings.num_stages > len(ops):
        raise SurgeError(
            f"cannot cut {len(ops)} operators into {settings.num_stages} stages; "
            "use fewer stages or finer operators"
        )
    for a, b in itertools.pairwise(ops):
        if b.block < a.block:
            raise SurgeError("operator blocks must be non-decreasing along the model")
    for op in ops:
        if op.compute_s < 0 or op.param_bytes < 0 or op.activation_bytes < 0:
            raise SurgeError("operator profiles must be >= 0")


def target_cycle_s(ops: tuple[OperatorProfile, ...], settings: PartitionSettings) -> float:
    """C: the setting, or the balanced cycle (Σ t_c + Σ s_p / B) / K."""
    if settings.target_cycle_s is not None:
        return settings.target_cycle_s
    total = sum(op.compute_s for op in ops)
    total += transfer_s(sum(op.param_bytes for op in ops), settings.bandwidth_gbps)
    return total / settings.num_stages


class _StageCost:
    """Eq. 2's per-stage term for any [start, end), from prefix sums."""

    def __init__(self, ops: tuple[OperatorProfile, ...], settings: PartitionSettings) -> None:
        self.ops, self.settings = ops, settings
        self.cycle_s = target_cycle_s(ops, settings)
        self.scale = activation_scale(settings)
        self.compute = [0.0]
        self.params = [0]
        for op in ops:
            self.compute.append(self.compute[-1] + op.compute_s)
            self.params.append(self.params[-1] + op.param_bytes)

    def param_bytes(self, start: int, end: int) -> int:
        return self.params[end] - self.params[start]

    def time_s(self, start: int, end: int) -> float:
        s = self.settings
        time = self.compute[end] - self.compute[start]
        time += transfer_s(self.param_bytes(start, end), s.bandwidth_gbps)
        if end < len(self.ops):
            time += transfer_s(self.ops[end - 1].activation_bytes * self.scale, s.bandwidth_gbps)
        return time

    def cost(self, start: int, end: int) -> float:
        if self.param_bytes(start, end) > self.settings.max_slot_memory_bytes:
            return math.inf
        mid_block = end < len(self.ops) and self.ops[end - 1].block == self.ops[end].block
        penalty = self.settings.boundary_penalty_s if mid_block else 0.0
        return abs(self.time_s(start, end) - self.cycle_s) + penalty


def partition_cost(
    ops: tuple[OperatorProfile, ...],
    bounds: tuple[tuple[int, int], ...],
    settings: PartitionSettings,
) -> float:
    """Eq. 2's objective of given stages (inf if a stage breaks the memory limit)."""
    stage = _StageCost(ops, settings)
    return sum(stage.cost(a, b) for a, b in bounds)


def partition_model(ops: tuple[OperatorProfile, ...], settings: PartitionSettings) -> Partition:
    """The K-stage partition minimising Eq. 2 under the memory limit (exact DP).

    Ties go to the earliest cuts. Raises `SurgeError` when no K-stage cut fits M_GPU.
    """
    _check_ops(ops, settings)
    n, k_max = len(ops), settings.num_stages
    stage = _StageCost(ops, settings)
    best = [[math.inf] * (n + 1) for _ in range(k_max + 1)]
    cut = [[0] * (n + 1) for _ in range(k_max + 1)]
    best[0][0] = 0.0
    for k in range(1, k_max + 1):
        for end in range(k, n - (k_max - k) + 1):
            for start in range(k - 1, end):
                if best[k - 1][start] == math.inf:
                    continue
                value = best[k - 1][start] + stage.cost(start, end)
                if value < best[k][end]:
                    best[k][end], cut[k][end] = value, start
    if best[k_max][n] == math.inf:
        raise SurgeError(
            f"no {k_max}-stage partition fits {settings.max_slot_memory_bytes} bytes per "
            "slot; use more stages or larger slots"
        )
    bounds: list[tuple[int, int]] = []
    end = n
    for k in range(k_max, 0, -1):
        start = cut[k][end]
        bounds.append((start, end))
        end = start
    bounds.reverse()
    return Partition(
        bounds=tuple(bounds),
        stage_times_s=tuple(stage.time_s(a, b) for a, b in bounds),
        cost=best[k_max][n],
    )
