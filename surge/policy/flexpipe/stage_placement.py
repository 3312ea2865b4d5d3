"""Where FlexPipe's stages go: §6.2 Eq. 6 slot allocation and §7 Eq. 13 affinity.

In: a group's stage sizes, the free slots (GPUs; a runtime node is one slot), which
server each slot is on, the model's hosting history. Out: the slot of each stage.
- `place_stages`: Eq. 6's multiplexing-aware allocation (`slot_allocation.allocate_slots`);
- `place_new_group`: a NEW group: on the past host Eq. 13 scores best when all its stages
  fit there, else on the past hosts' slots first, else by `place_stages`.
Both bodies call these through `flexpipe/system` (the simulator's scale-out and
refactoring, the runtime's scale-out and the controller's refactorings). Pure and
deterministic.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.flexpipe.slot_allocation import (
    HostingRecord,
    SlotState,
    StageDemand,
    affinity_score,
    allocate_slots,
    choose_affinity_server,
)


@dataclass(frozen=True)
class Affinity:
    """What §7 Eq. 13 places a new pipeline by: the model's hosting history."""

    history: tuple[HostingRecord, ...]
    """The servers that hosted the model and when (same clock as `now_s`)."""
    server_of: Mapping[int, int]
    """Each slot's server."""
    now_s: float


def place_stages(
    model_id: str,
    stage_bytes: Sequence[int],
    throughput_rps: float,
    cv: float,
    slots: Sequence[SlotState],
    settings: FlexPipeSettings,
) -> tuple[int, ...] | None:
    """§6.2: the slot of each stage, in stage order; None if a stage fits nowhere."""
    demands = [
        StageDemand(model_id, i, max(b, 1), throughput_rps, cv) for i, b in enumerate(stage_bytes)
    ]
    alloc = allocate_slots(demands, slots, settings.multiplex)
    if alloc.unplaced:
        return None
    by_stage = {i: slot for _, i, slot in alloc.assignments}
    return tuple(by_stage[i] for i in range(len(stage_bytes)))


def place_new_group(
    model_id: str,
    stage_bytes: Sequence[int],
    throughput_rps: float,
    cv: float,
    slots: Sequence[SlotState],
    server_of: Mapping[int, int],
    history: Sequence[HostingRecord],
    now_s: float,
    settings: FlexPipeSettings,
) -> tuple[int, ...] | None:
    """§7 Eq. 13, then §6.2 Eq. 6: the slots of a new group's stages. Its stages go to the
    server Eq. 13 picks among those that hosted the model (`history`; recent hosting and
    free GPUs score, so parameters still in that host's memory are reused, §7) when they
    all fit there. Else, when past hosts have free slots (the runtime: each node is its
    own server with one slot), the stages take the past hosts' slots first, best Eq. 13
    score first, and the fewest other slots after them (ours); with no past host free,
    `place_stages` over every slot. `server_of` maps a slot to its server. None if a
    stage fits nowhere."""
    free: dict[int, int] = {}
    for s in slots:
        free[server_of[s.slot_id]] = free.get(server_of[s.slot_id], 0) + 1
    server = choose_affinity_server(history, free, now_s, len(stage_bytes), settings.affinity)
    if server is not None:
        local = [s for s in slots if server_of[s.slot_id] == server]
        placed = place_stages(model_id, stage_bytes, throughput_rps, cv, local, settings)
        if placed is not None:
            return placed
    rank: dict[int, tuple[float, float]] = {}
    for r in history:
        if free.get(r.server_id, 0) > 0:
            score = affinity_score(r, free[r.server_id], now_s, settings.affinity)
            rank[r.server_id] = max(
                rank.get(r.server_id, (score, r.last_hosted_s)), (score, r.last_hosted_s)
            )
    past = sorted(rank, key=lambda h: (-rank[h][0], -rank[h][1], h))
    ordered = [s for h in past for s in slots if server_of[s.slot_id] == h]
    ordered += [s for s in slots if server_of[s.slot_id] not in rank]
    for k in range(len(stage_bytes), len(ordered) + 1) if past else ():
        placed = place_stages(model_id, stage_bytes, throughput_rps, cv, ordered[:k], settings)
        if placed is not None:
            return placed
    return place_stages(model_id, stage_bytes, throughput_rps, cv, slots, settings)
