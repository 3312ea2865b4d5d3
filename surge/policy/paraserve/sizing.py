"""ParaServe pipeline-parallelism size selection (§4.1, Alg. 1, Eq. 1/2, Eq. 5).

In: a `SizingRequest`: the model's size, the GPU servers' free memory, network and PCIe
bandwidth (the network share already cut by contention-aware placement, see
`paraserve/placement`), the historical stage times (t_c, t_n, t_p, t_d, t_w and, for
Eq. 5, t_cc, t_cu, t_l) and the TTFT/TPOT SLOs.
Out: a `SizingDecision` (s, w, servers): pipeline size, how many of the s workers get
full memory, and which server runs each worker, with the predicted TTFT/TPOT. The first
(s, w) in the order s = 1..max, w = 0..s that meets both SLOs, which is the minimal
parallelism and then the minimal GPU memory; else one full-memory worker on the best
server (`meets_slo` False); `None` when no server can take a worker holding the
whole model (too little memory, or a network share of 0).

Server choice for a given (s, w) (§4.1.2): the w full-memory workers go to the servers
that fit the whole model with the shortest start-up term, then the s − w low-memory
workers to the shortest of the rest that fit M/s. Alg. 1 ranks servers by 1/b + 1/p,
which orders them by Eq. 1's fetch+load time (M/s)(1/b + 1/p); we rank by the start-up
term of the TTFT model in use, which is the same order for Eq. 1 and the right one for
Eq. 5 (whose term is not a function of 1/b + 1/p). Since TTFT depends on the servers
only through the largest such term, this choice minimises TTFT for the (s, w).
"""

import math
from dataclasses import dataclass, field

from surge.errors import SurgeError
from surge.policy.multicast.timing import BITS_PER_BYTE, BITS_PER_GBIT


def transfer_s(num_bytes: float, gbps: float) -> float:
    """Seconds to move `num_bytes` at `gbps` Gbit/s."""
    return num_bytes * BITS_PER_BYTE / (gbps * BITS_PER_GBIT)


@dataclass(frozen=True)
class GpuServer:
    """One GPU server as the sizing sees it."""

    server_id: int
    """Identifier, unique in a request."""
    free_memory_bytes: int
    """GPU memory not yet allocated (>= 0)."""
    network_gbps: float
    """b_i: network bandwidth a new worker gets here (Gbit/s, >= 0; 0 = refuses workers)."""
    pcie_gbps: float
    """p_i: host-to-GPU PCIe bandwidth (Gbit/s, > 0)."""


@dataclass(frozen=True)
class StageTimes:
    """Historical cold-start stage times of the model, in seconds (all >= 0)."""

    runtime_init_s: float
    """t_c: container creation and runtime initialisation (Eq. 1)."""
    transmission_s: float
    """t_n: one hop of intermediate results between two workers (TCP latency)."""
    prefill_s: float
    """t_p: prefill of one request on a full-memory single worker."""
    decode_s: float
    """t_d: one decoding step on a full-memory single worker."""
    wait_s: float
    """t_w: the longest a request of this model has waited in the queue."""
    container_create_s: float = 0.0
    """t_cc: container creation alone (Eq. 5)."""
    cuda_init_s: float = 0.0
    """t_cu: CUDA context initialisation (Eq. 5)."""
    library_load_s: float = 0.0
    """t_l: loading the Python libraries (Eq. 5)."""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not (math.isfinite(value) and value >= 0):
                raise SurgeError(f"stage time {name} must be a finite number >= 0 (got {value})")


@dataclass(frozen=True)
class SizingSettings:
    """Knobs of Alg. 1."""

    max_pipeline_size: int = 4
    """Largest s tried; §4.1.2 caps it at 4 ("larger sizes gain little")."""
    overlap_startup: bool = False
    """Predict TTFT with Eq. 5 (model prefetch overlapped with container start-up, §5)
    instead of Eq. 1. Use it once the runtime overlaps the two."""

    def __post_init__(self) -> None:
        if self.max_pipeline_size < 1:
            raise SurgeError(f"max_pipeline_size must be >= 1 (got {self.max_pipeline_size})")


@dataclass(frozen=True)
class SizingRequest:
    """Everything Alg. 1 reads. Validated once at construction."""

    model_bytes: int
    """M, the model's size (> 0)."""
    servers: tuple[GpuServer, ...]
    """Candidate servers; each runs at most one worker of the group."""
    times: StageTimes
    """Historical stage times of this model."""
    ttft_slo_s: float
    """SLO on time to first token (> 0)."""
    tpot_slo_s: float
    """SLO on time per output token (> 0)."""
    settings: SizingSettings = field(default_factory=SizingSettings)
    """Algorithm knobs."""
    fetch_bytes: tuple[int, ...] = ()
    """Entry s − 1: the most bytes one worker of an s-worker group fetches, where the
    caller cuts the model at block boundaries (16 blocks in 3 parts: 6/16, not 1/3);
    empty or shorter than s: M/s (Eq. 1's term)."""

    def __post_init__(self) -> None:
        if self.model_bytes <= 0:
            raise SurgeError(f"model_bytes must be > 0 (got {self.model_bytes})")
        if not (self.ttft_slo_s > 0 and self.tpot_slo_s > 0):
            raise SurgeError("TTFT and TPOT SLOs must be > 0 seconds")
        ids = [s.server_id for s in self.servers]
        if len(set(ids)) != len(ids):
            raise SurgeError("server ids must be unique")
        for s in self.servers:
            if s.free_memory_bytes < 0 or not s.network_gbps >= 0 or not s.pcie_gbps > 0:
                raise SurgeError(
                    f"server {s.server_id}: need free memory >= 0, network >= 0 and PCIe > 0 Gbit/s"
                )


@dataclass(frozen=True)
class SizingDecision:
    """A cold-start scheme (Alg. 1's output) and its predicted latencies."""

    pipeline_size: int
    """s, workers in the pipeline group."""
    num_full_memory_workers: int
    """w, workers given the memory of the unpartitioned model (0 <= w <= s)."""
    full_memory_servers: tuple[int, ...]
    """Server ids of the w full-memory workers."""
    low_memory_servers: tuple[int, ...]
    """Server ids of the s − w low-memory workers (memory M/s each)."""
    ttft_s: float
    """Predicted time to first token (Eq. 1, or Eq. 5 with overlap)."""
    tpot_s: float
    """Predicted time per output token (Eq. 2)."""
    meets_slo: bool
    """False only for the single-worker fallback when nothing met both SLOs."""

    @property
    def servers(self) -> tuple[int, ...]:
        """All s servers, full-memory workers first."""
        return self.full_memory_servers + self.low_memory_servers


def partition_bytes(model_bytes: int, pipeline_size: int) -> int:
    """M/s rounded up: what one worker fetches, and a low-memory worker's memory."""
    return -(-model_bytes // pipeline_size)


def fetch_bytes(request: SizingRequest, pipeline_size: int) -> int:
    """What the slowest-to-fetch worker of an s-worker group fetches: the caller's cut
    (`SizingRequest.fetch_bytes`) if given, else M/s."""
    if pipeline_size <= len(request.fetch_bytes):
        return request.fetch_bytes[pipeline_size - 1]
    return partition_bytes(request.model_bytes, pipeline_size)


def startup_s(request: SizingRequest, pipeline_size: int, server: GpuServer) -> float:
    """One worker's time from launch until its part of the model is on the GPU.

    Eq. 1: t_c + (M/s)(1/b + 1/p). Eq. 5 (overlap): max(t_cc + t_cu + max((M/s)/p, t_l),
    (M/s)/b). Infinite on a server that refuses workers (b = 0).
    """
    if server.network_gbps <= 0:
        return math.inf
    part = fetch_bytes(request, pipeline_size)
    fetch_s = transfer_s(part, server.network_gbps)
    load_s = transfer_s(part, server.pcie_gbps)
    t = request.times
    if request.settings.overlap_startup:
        return max(t.container_create_s + t.cuda_init_s + max(load_s, t.library_load_s), fetch_s)
    return t.runtime_init_s + fetch_s + load_s


def pipeline_slowdown(pipeline_size: int, num_full: int) -> float:
    """s − w + w/s: a full-memory worker runs its part in 1/s of the time, a low-memory one
    (1/s of the compute quota) in the full time (§4.1.1)."""
    return pipeline_size - num_full + num_full / pipeline_size


def predict_ttft_s(
    request: SizingRequest, pipeline_size: int, num_full: int, servers: tuple[GpuServer, ...]
) -> float:
    """Eq. 1 (or Eq. 5): t_w + max_i start-up_i + t_p (s − w + w/s) + t_n s."""
    t = request.times
    slowest = max(startup_s(request, pipeline_size, s) for s in servers)
    return (
        t.wait_s
        + slowest
        + t.prefill_s * pipeline_slowdown(pipeline_size, num_full)
        + t.transmission_s * pipeline_size
    )


def predict_tpot_s(times: StageTimes, pipeline_size: int, num_full: int) -> float:
    """Eq. 2: t_d (s − w + w/s) + t_n s."""
    slowdown = pipeline_slowdown(pipeline_size, num_full)
    return times.decode_s * slowdown + times.transmission_s * pipeline_size


def _choose_servers(
    request: SizingRequest, pipeline_size: int, num_full: int
) -> tuple[tuple[GpuServer, ...], tuple[GpuServer, ...]] | None:
    """Alg. 1's server choice for (s, w), or None when too few servers fit."""

    def key(server: GpuServer) -> tuple[float, int]:
        return (startup_s(request, pipeline_size, server), server.server_id)

    usable = [s for s in request.servers if s.network_gbps > 0]
    full_fit = sorted((s for s in usable if s.free_memory_bytes >= request.model_bytes), key=key)
    if len(full_fit) < num_full:
        return None
    full = tuple(full_fit[:num_full])
    part = partition_bytes(request.model_bytes, pipeline_size)
    rest = sorted((s for s in usable if s.free_memory_bytes >= part and s not in full), key=key)
    num_low = pipeline_size - num_full
    if len(rest) < num_low:
        return None
    return full, tuple(rest[:num_low])


def _decision(
    request: SizingRequest,
    pipeline_size: int,
    num_full: int,
    full: tuple[GpuServer, ...],
    low: tuple[GpuServer, ...],
    meets_slo: bool | None = None,
) -> SizingDecision:
    ttft_s = predict_ttft_s(request, pipeline_size, num_full, full + low)
    tpot_s = predict_tpot_s(request.times, pipeline_size, num_full)
    if meets_slo is None:
        meets_slo = ttft_s <= request.ttft_slo_s and tpot_s <= request.tpot_slo_s
    return SizingDecision(
        pipeline_size=pipeline_size,
        num_full_memory_workers=num_full,
        full_memory_servers=tuple(s.server_id for s in full),
        low_memory_servers=tuple(s.server_id for s in low),
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        meets_slo=meets_slo,
    )


def select_parallelism(request: SizingRequest) -> SizingDecision | None:
    """Alg. 1: the smallest (s, w) whose predicted TTFT and TPOT meet the SLOs.

    Falls back to one full-memory worker on the best server that fits the model
    (`meets_slo` False); when no server holds the whole model, to the first feasible
    (s, w) in the same order — the smallest group whose parts fit (a model larger than
    any one GPU still starts); None if no group of up to `max_pipeline_size` fits.
    """
    first_feasible: SizingDecision | None = None
    for pipeline_size in range(1, request.settings.max_pipeline_size + 1):
        for num_full in range(pipeline_size + 1):
            chosen = _choose_servers(request, pipeline_size, num_full)
            if chosen is None:
                continue
            decision = _decision(request, pipeline_size, num_full, *chosen)
            if decision.meets_slo:
                return decision
            if first_feasible is None:
                first_feasible = decision
    single = _choose_servers(request, 1, 1)
    if single is None:
        return first_feasible
    return _decision(request, 1, 1, *single, meets_slo=False)
