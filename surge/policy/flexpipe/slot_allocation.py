"""FlexPipe placement: slot allocation with the multiplexing penalty (§6.2, Eq. 6-9) and
affinity-based server choice (§7, Eq. 13).

In: the stages to place (model, stage index, memory, throughput, the model's CV), the
slots (GPUs) with their free memory and the models already on them, and
`MultiplexSettings`; or, for affinity, which servers hosted a model and when, their free
GPUs, the current time and `AffinitySettings`.
Out: `allocate_slots` returns a `SlotAllocation` (stage -> slot) built greedily on Eq. 6:
each stage, largest first, goes to the slot with the best marginal objective

    T_i / m_i − γ(CV_i) · [slot already used] − γ(CV_r) · [slot had exactly one model r]
    − idle_slot_cost · [slot was empty],     γ(CV) = γ0 (1 + α CV²)   (Eq. 9)

under the memory limit (Eq. 7) and §6.2's rule that no two stages of one model share a
slot. Greedy, not the optimum of Eq. 6 (which is an integer program); Eq. 8's balance
between stages of one granularity is left to the partitioner (`flexpipe/partition`).
`idle_slot_cost` is ours: Eq. 6 has no price for waking an empty GPU, so without it
isolation would always win and stable models would never be consolidated, which §6.2
says they should be.
`choose_affinity_server` returns Eq. 13's s* = argmax_{s ∈ H_i} w_t e^{−λ(t_now − t_s)}
+ w_g |g_s ∩ G_avail| among past hosts with enough free GPUs.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from surge.errors import SurgeError


@dataclass(frozen=True)
class MultiplexSettings:
    """Constants of Eq. 6/9. Validated once at construction."""

    base_penalty: float = 0.1
    """γ0 of Eq. 9 (>= 0): the multiplexing penalty of a perfectly steady model."""
    cv_sensitivity: float = 1.0
    """α of Eq. 9 (>= 0): how the penalty grows with CV² (bursty models interfere more)."""
    idle_slot_cost: float = 0.3
    """Cost of putting a stage on an empty slot (>= 0), in Eq. 6's units; ours, see module
    docstring. Stable models (γ(CV) below it) share slots, bursty ones (above it) don't."""

    def __post_init__(self) -> None:
        if min(self.base_penalty, self.cv_sensitivity, self.idle_slot_cost) < 0:
            raise SurgeError("base_penalty, cv_sensitivity and idle_slot_cost must be >= 0")


@dataclass(frozen=True)
class StageDemand:
    """One pipeline stage to place."""

    model_id: str
    """The model the stage belongs to."""
    stage_index: int
    """Its position in the model's pipeline."""
    memory_bytes: int
    """m_i: memory it needs on a slot (> 0)."""
    throughput_rps: float
    """T_i: its throughput on a slot (requests/s, > 0)."""
    cv: float
    """CV_i of the model's request arrivals (>= 0)."""


@dataclass(frozen=True)
class SlotState:
    """One slot (GPU) before allocation."""

    slot_id: int
    """Identifier, unique."""
    free_memory_bytes: int
    """M_j minus what is already allocated (>= 0)."""
    resident_models: tuple[tuple[str, float], ...] = ()
    """(model id, CV) of every stage already on the slot."""


@dataclass(frozen=True)
class SlotAllocation:
    """Where each stage went, or `unplaced` for stages no slot could take."""

    assignments: tuple[tuple[str, int, int], ...]
    """(model id, stage index, slot id) per placed stage."""
    unplaced: tuple[tuple[str, int], ...]
    """(model id, stage index) of stages that fit nowhere."""
    objective: float
    """Sum of the marginal gains taken (Eq. 6 with the idle-slot cost)."""


def multiplexing_penalty(cv: float, settings: MultiplexSettings) -> float:
    """Eq. 9: γ(CV) = γ0 (1 + α CV²)."""
    return settings.base_penalty * (1.0 + settings.cv_sensitivity * cv * cv)


def allocate_slots(
    stages: Sequence[StageDemand], slots: Sequence[SlotState], settings: MultiplexSettings
) -> SlotAllocation:
    """Greedy Eq. 6 allocation (see module docstring). Deterministic: stages by memory
    descending then (model, index); ties between slots go to the lowest slot id."""
    if len({s.slot_id for s in slots}) != len(slots):
        raise SurgeError("slot ids must be unique")
    free = {s.slot_id: s.free_memory_bytes for s in slots}
    residents: dict[int, list[tuple[str, float]]] = {
        s.slot_id: list(s.resident_models) for s in slots
    }
    assignments: list[tuple[str, int, int]] = []
    unplaced: list[tuple[str, int]] = []
    objective = 0.0
    order = sorted(stages, key=lambda s: (-s.memory_bytes, s.model_id, s.stage_index))
    for stage in order:
        if stage.memory_bytes <= 0 or stage.throughput_rps <= 0 or stage.cv < 0:
            raise SurgeError(f"stage {stage.model_id}/{stage.stage_index}: bad demand")
        best: tuple[float, int] | None = None
        for slot_id in sorted(free):
            here = residents[slot_id]
            if free[slot_id] < stage.memory_bytes or any(m == stage.model_id for m, _ in here):
                continue
            gain = stage.throughput_rps / stage.memory_bytes
            if not here:
                gain -= settings.idle_slot_cost
            else:
                gain -= multiplexing_penalty(stage.cv, settings)
                if len({m for m, _ in here}) == 1:  # the resident model becomes shared too
                    gain -= multiplexing_penalty(max(cv for _, cv in here), settings)
            if best is None or gain > best[0]:
                best = (gain, slot_id)
        if best is None:
            unplaced.append((stage.model_id, stage.stage_index))
            continue
        gain, slot_id = best
        free[slot_id] -= stage.memory_bytes
        residents[slot_id].append((stage.model_id, stage.cv))
        assignments.append((stage.model_id, stage.stage_index, slot_id))
        objective += gain
    return SlotAllocation(tuple(assignments), tuple(unplaced), objective)


@dataclass(frozen=True)
class AffinitySettings:
    """Constants of Eq. 13. Validated once at construction."""

    temporal_weight: float = 1.0
    """w_t (>= 0): weight of how recently the server hosted the model."""
    gpu_weight: float = 0.1
    """w_g (>= 0): weight per available GPU on the server."""
    decay_per_s: float = 1.0 / 300.0
    """λ (1/s, >= 0): temporal decay; default forgets a host over ~5 minutes, FlexPipe's
    reclamation window (§9.4)."""

    def __post_init__(self) -> None:
        if min(self.temporal_weight, self.gpu_weight, self.decay_per_s) < 0:
            raise SurgeError("affinity weights and decay must be >= 0")


@dataclass(frozen=True)
class HostingRecord:
    """An entry of H_i: a server that hosted the model."""

    server_id: int
    """The server."""
    last_hosted_s: float
    """t_s: the last time it hosted the model."""


def affinity_score(
    record: HostingRecord, available_gpus: int, now_s: float, settings: AffinitySettings
) -> float:
    """Eq. 13's term: w_t e^{−λ(t_now − t_s)} + w_g |g_s ∩ G_avail|."""
    recency = math.exp(-settings.decay_per_s * max(0.0, now_s - record.last_hosted_s))
    return settings.temporal_weight * recency + settings.gpu_weight * available_gpus


def choose_affinity_server(
    history: Sequence[HostingRecord],
    available_gpus: dict[int, int],
    now_s: float,
    num_gpus_needed: int,
    settings: AffinitySettings,
) -> int | None:
    """Eq. 13: the past host with the highest score among those with `num_gpus_needed`
    free GPUs; ties to the most recent, then the lowest id. None if no past host fits
    (the caller then places without affinity)."""
    latest: dict[int, float] = {}
    for r in history:
        latest[r.server_id] = max(latest.get(r.server_id, -math.inf), r.last_hosted_s)
    fits = [
        HostingRecord(s, t)
        for s, t in latest.items()
        if available_gpus.get(s, 0) >= num_gpus_needed
    ]
    if not fits:
        return None
    best = max(
        fits,
        key=lambda r: (
            affinity_score(r, available_gpus[r.server_id], now_s, settings),
            r.last_hosted_s,
            -r.server_id,
        ),
    )
    return best.server_id
