"""FlexPipe's settings: one frozen, validated dataclass of every knob its decisions read
(granularity, partition, placement, affinity, scaling, micro-batches). Read by every
module of `policy/flexpipe/` and by `policy/systems.py`; a deployment or a simulation run
picks them through its system.
"""

from dataclasses import dataclass, field

from surge.errors import SurgeError
from surge.policy.flexpipe.granularity import GranularitySettings, ScalingSettings
from surge.policy.flexpipe.hrg import HrgSettings
from surge.policy.flexpipe.slot_allocation import AffinitySettings, MultiplexSettings


@dataclass(frozen=True)
class FlexPipeSettings:
    """FlexPipe's knobs. Validated at construction."""

    stage_counts: tuple[int, ...] = (1, 2, 4, 8)
    """Granularities η_k to choose among, coarse to fine."""
    cv_targets: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    """ν_k: the arrival CV each granularity suits (bursty traffic wants finer stages). Ours:
    Poisson arrivals (CV 1, §9's "stable workload") suit the coarsest pipeline, and each
    doubling of the CV one doubling of the stage count (§9 evaluates CV 1/2/4/8)."""
    granularity: GranularitySettings = field(default_factory=GranularitySettings)
    """Eq. 4's constants and our hysteresis."""
    multiplex: MultiplexSettings = field(default_factory=MultiplexSettings)
    """Eq. 6/9's constants."""
    affinity: AffinitySettings = field(default_factory=AffinitySettings)
    """Eq. 13's constants: where a new group goes among the servers that hosted the model."""
    hrg: HrgSettings = field(default_factory=HrgSettings)
    """§7's Hierarchical Resource Graph: a pipeline's stages on the fewest servers, one rack,
    away from recent scaling (`flexpipe/hrg.py`)."""
    boundary_penalty_s: float = 0.0
    """λ of Eq. 2 (layers are the blocks here: every cut is at a block boundary)."""
    cv_window_s: float = 30.0
    """Sliding window of arrivals whose CV ν_t is measured (§6.1)."""
    decision_interval_s: float = 1.0
    """How often the granularity controller takes a CV sample and decides (§6.1 Alg. 1's
    interval; the smoothing in `granularity` counts these samples)."""
    min_group_kv_tokens: int = 2048
    """The least KV cache (tokens) one micro-batch group of a runtime pipeline head is
    split: the head keeps η micro-batches for η stages (§7 Eq. 12) but no more than its
    stages' cache over this (`microbatch.micro_batch_limit`). Ours: a 2k context."""
    scaling: ScalingSettings = field(
        default_factory=lambda: ScalingSettings(max_granularity=8, sigmoid_offset=7.0)
    )
    """Eq. 11/12's constants (§7): the granularity of a new instance under a queue.
    `max_granularity` beyond the largest of `stage_counts` is clipped to it. Ours: β =
    G_max − 1, so a steady model with no queue scales out as one coarse stage (m = 1 at
    cv·q̂ = 0) and m reaches G_max/2 near cv·q̂ = 1 (γ = 2)."""

    default_decode_steps: int = 128
    """Decode steps of a typical request, for `useful_stages` when no request waits to
    tell (ours: §9's 128-token outputs)."""
    merge_busy_groups: bool = True
    """Whether a busy group merges to the stages that hold its requests while none waits
    (`groups.group_refactors`; ours, after Fig. 7's "modifies to a coarser granularity").
    False, a counterfactual: only the idle group served next merges. A merge keeps the head
    engines past its micro-batch count until they finish, and on the merged stages they
    step in turn unless `batch_merged_sequences` (docs/flexpipe.md)."""
    batch_merged_sequences: bool = True
    """Whether a merge hands the sequences of the head engines past its micro-batch count
    to the engines that stay (`merge.adoptions`), K/V in place, so one decode step serves
    them all: Alg. 1 line 15 "activate[s the] new pipeline configuration" (§7 Eq. 12: one
    micro-batch per stage) and §6.3 keeps the inference going through it. False, a
    counterfactual (before 2026-11-29): the retired engines finish what they hold, stepping
    in turn on the merged stages, each step through every layer."""

    def __post_init__(self) -> None:
        if not self.stage_counts or len(self.stage_counts) != len(self.cv_targets):
            raise SurgeError("give one CV target per stage count")
        if min(self.stage_counts) < 1 or list(self.stage_counts) != sorted(self.stage_counts):
            raise SurgeError("stage counts must be >= 1 and ascending (coarse to fine)")
        if not (self.cv_window_s > 0 and self.decision_interval_s > 0):
            raise SurgeError("cv_window_s and decision_interval_s must be > 0")
        if self.min_group_kv_tokens < 1 or self.default_decode_steps < 1:
            raise SurgeError("min_group_kv_tokens and default_decode_steps must be >= 1")
