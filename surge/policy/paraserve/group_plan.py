"""ParaServe's pipeline group for one cold start (§4.1 Alg. 1, §4.2 Alg. 2).

In: a `GroupRequest`: the model's block sizes, the servers free to take a worker, the
model's stage times and the SLOs, and Alg. 2's network state. Out: a `GroupPlan`:
`plan_group` sizes the group by the SLOs (`sizing.py`), places it on the servers'
contention-adjusted network shares (`placement.py`), and gives each member a contiguous
part of the blocks, balanced by bytes (`split_blocks`), to fetch first. `alg1_inputs` is
the one place both bodies take Alg. 1's stage times and settings from for a system.

`surge serve` (`runtime/scaleout/paraserve.py`, through `groups.py`) and the simulator
(`sim/groups.py`) both call these. Pure and deterministic.
"""

from dataclasses import dataclass, field, replace

from surge.errors import SurgeError
from surge.policy.paraserve.placement import ServerNetwork, place_cold_start
from surge.policy.paraserve.sizing import (
    GpuServer,
    SizingDecision,
    SizingRequest,
    SizingSettings,
    StageTimes,
)
from surge.policy.systems import SystemConfig


@dataclass(frozen=True)
class GroupRequest:
    """One ParaServe cold start: which servers may take a worker, and the SLOs."""

    block_bytes: tuple[int, ...]
    """Size of each block of the model, in layer order."""
    servers: tuple[GpuServer, ...]
    """Servers free to take a worker (`server_id` = the caller's node id)."""
    times: StageTimes
    """Historical stage times of the model (ParaServe §4.1, Eq. 1/2/5)."""
    ttft_slo_s: float
    """Time-to-first-token objective, seconds."""
    tpot_slo_s: float
    """Time-per-output-token objective, seconds."""
    settings: SizingSettings = field(default_factory=SizingSettings)
    """Alg. 1's limits (most workers, overlapped start-up)."""
    networks: tuple[ServerNetwork, ...] = ()
    """Alg. 2's state: workers fetching on each server now (none = no contention)."""
    now_s: float = 0.0
    """Current time, seconds (Alg. 2's deadlines)."""
    model_id: str = "model"
    """Names the workers in Alg. 2's state."""

    def __post_init__(self) -> None:
        if not self.block_bytes or min(self.block_bytes) <= 0:
            raise SurgeError("a group needs one or more blocks of > 0 bytes")


@dataclass(frozen=True)
class GroupPlan:
    """A ParaServe pipeline group: who fetches which blocks first."""

    members: tuple[int, ...]
    """Server ids in stage (layer) order."""
    parts: tuple[tuple[int, ...], ...]
    """Blocks each member fetches first: contiguous, in layer order, balanced by bytes."""
    sizing: SizingDecision
    """Alg. 1's decision (pipeline size, predicted TTFT/TPOT, whether SLOs are met)."""
    networks: tuple[ServerNetwork, ...]
    """Alg. 2's state with this group's workers admitted (pass to the next request)."""


def split_blocks(block_bytes: tuple[int, ...], num_parts: int) -> tuple[tuple[int, ...], ...]:
    """Contiguous parts of the blocks, one per stage, each as close to an equal share of the
    bytes as the block boundaries allow (cut at the block nearest each ideal boundary)."""
    n = len(block_bytes)
    if not 1 <= num_parts <= n:
        raise SurgeError(f"cannot split {n} blocks into {num_parts} non-empty parts")
    total = sum(block_bytes)
    cuts, acc, b = [0], 0, 0
    for i in range(1, num_parts):
        target = total * i / num_parts
        while b < n and acc + block_bytes[b] / 2 <= target:
            acc += block_bytes[b]
            b += 1
        lo, hi = cuts[-1] + 1, n - (num_parts - i)  # every part keeps >= 1 block
        b = min(max(b, lo), hi)
        acc = sum(block_bytes[:b])
        cuts.append(b)
    cuts.append(n)
    return tuple(tuple(range(cuts[i], cuts[i + 1])) for i in range(num_parts))


def _largest_parts(block_bytes: tuple[int, ...], max_parts: int) -> tuple[int, ...]:
    """Per s = 1..: the bytes of the largest of `split_blocks`' s parts, so Alg. 1 times
    the fetch the group will make (16 blocks in 3 parts: 6/16 of the model, not 1/3)."""
    return tuple(
        max(sum(block_bytes[b] for b in part) for part in split_blocks(block_bytes, k))
        for k in range(1, min(max_parts, len(block_bytes)) + 1)
    )


def plan_group(request: GroupRequest) -> GroupPlan | None:
    """ParaServe's group for one cold start: Alg. 2's contention-adjusted shares, Alg. 1's
    size and servers on them, members in stage order (full-memory workers first, as Alg. 1
    lists them), parts split by bytes. None when no server can take a worker. Alg. 1 tries
    no more workers than there are blocks, so it sizes (and Alg. 2 reserves shares for)
    the group that fetches."""
    most = min(request.settings.max_pipeline_size, len(request.block_bytes))
    sizing = SizingRequest(
        model_bytes=sum(request.block_bytes),
        servers=request.servers,
        times=request.times,
        ttft_slo_s=request.ttft_slo_s,
        tpot_slo_s=request.tpot_slo_s,
        settings=replace(request.settings, max_pipeline_size=most),
        fetch_bytes=_largest_parts(request.block_bytes, most),
    )
    networks = {n.server_id: n for n in request.networks}
    decision, updated = place_cold_start(sizing, networks, request.model_id, request.now_s)
    if decision is None:
        return None
    members = decision.servers
    parts = split_blocks(request.block_bytes, len(members))
    return GroupPlan(members, parts, decision, tuple(updated[k] for k in sorted(updated)))


def alg1_inputs(
    system: SystemConfig, prefill_s: float, decode_s: float, wait_s: float
) -> tuple[StageTimes, SizingSettings]:
    """Alg. 1's stage times and settings for `system` (ParaServe §4.1), the one place both
    bodies take them from: Eq. 5 when its start-up runs beside the fetch
    (`init_overlaps_load`: t_cc = `init_s`), else Eq. 1 (t_c = `init_s`); t_n = the
    system's `stage_hop_s`; t_p, t_d and t_w are the caller's measurements."""
    times = StageTimes(
        container_create_s=system.init_s if system.init_overlaps_load else 0.0,
        runtime_init_s=system.init_s,
        transmission_s=system.stage_hop_s,
        prefill_s=prefill_s,
        decode_s=decode_s,
        wait_s=max(wait_s, 0.0),
    )
    settings = SizingSettings(
        max_pipeline_size=system.pipeline_size, overlap_startup=system.init_overlaps_load
    )
    return times, settings
