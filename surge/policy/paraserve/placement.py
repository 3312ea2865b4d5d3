"""ParaServe network-contention-aware worker placement (§4.2, Alg. 2, Eq. 3/4).

Cold-start workers fetching on one server share its network bandwidth B equally. The
controller keeps, per server, each fetching worker's deadline D_i and estimated pending
bytes S_i, and the time T' of the last bandwidth change.

In: a `ServerNetwork` per server, the current time (given by the caller: no clocks here).
Out:
- `share_for_new_worker_gbps` (GETNODEBANDWIDTH): the bandwidth a new worker would get,
  B/(N+1), or 0 when that share would make a fetching worker miss its deadline (Eq. 3).
  Alg. 2 prints B/N as the return value; §4.2.1 says the share becomes B/(N+1) once the
  new worker joins, which is what the new worker gets, so we return that.
- `handle_bandwidth_change` (HANDLEBANDWIDTHCHANGE): pending bytes advanced by Eq. 4
  S_i ← S_i − B/N (T − T'); workers at or below zero are done and dropped.
- `admit_worker` / `finish_worker`: a worker starts or stops fetching; both change the
  bandwidth, so both apply Eq. 4 first: pending sizes are updated on every change.
  `admit_background`: a consolidating worker's background fetch of the rest (§6.1)
  shares the NIC too, without a deadline.
- `contention_adjusted_servers`: the `GpuServer`s for `paraserve/sizing` with each
  server's network bandwidth replaced by the share a new worker would get.
- `fetch_deadline_s`: the deadline recorded for a worker from its TTFT prediction.
- `place_cold_start`: the two together: size on the contention-adjusted shares, then
  record every chosen worker (M/s bytes pending, its deadline) on its server.
"""

import math
from dataclasses import dataclass, replace

from surge.errors import SurgeError
from surge.policy.multicast.timing import BITS_PER_BYTE, BITS_PER_GBIT
from surge.policy.paraserve.sizing import (
    GpuServer,
    SizingDecision,
    SizingRequest,
    fetch_bytes,
    select_parallelism,
    transfer_s,
)

DEADLINE_TOLERANCE_BYTES = 1e-6
"""Slack on Eq. 3 for floating-point rounding."""


@dataclass(frozen=True)
class FetchingWorker:
    """One cold-start worker still fetching its part of a model."""

    worker_id: str
    """Identifier, unique on its server."""
    deadline_s: float
    """D_i: when its fetch must be complete for its request to meet the TTFT SLO."""
    pending_bytes: float
    """S_i: bytes still to fetch, as estimated at the last bandwidth change."""


@dataclass(frozen=True)
class ServerNetwork:
    """The fetch state of one server's network. Validated once at construction."""

    server_id: int
    """The server this describes."""
    bandwidth_gbps: float
    """B: the server's network bandwidth (Gbit/s, > 0)."""
    workers: tuple[FetchingWorker, ...] = ()
    """The N cold-start workers fetching here."""
    last_change_s: float = 0.0
    """T': when the bandwidth share last changed."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            raise SurgeError(
                f"server {self.server_id}: bandwidth must be > 0 Gbit/s (got {self.bandwidth_gbps})"
            )
        ids = [w.worker_id for w in self.workers]
        if len(set(ids)) != len(ids):
            raise SurgeError(f"server {self.server_id}: fetching worker ids must be unique")

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """B in bytes per second."""
        return self.bandwidth_gbps * BITS_PER_GBIT / BITS_PER_BYTE


def _check_time(network: ServerNetwork, now_s: float) -> None:
    if now_s < network.last_change_s:
        raise SurgeError(
            f"server {network.server_id}: time {now_s} is before the last bandwidth change "
            f"at {network.last_change_s}; pass a current time"
        )


def handle_bandwidth_change(network: ServerNetwork, now_s: float) -> ServerNetwork:
    """Alg. 2 HANDLEBANDWIDTHCHANGE: advance pending bytes to `now_s` by Eq. 4, drop the
    workers that are done, and set T' = now."""
    _check_time(network, now_s)
    if network.workers:
        fetched = network.bandwidth_bytes_per_s / len(network.workers)
        fetched *= now_s - network.last_change_s
        workers = tuple(
            replace(w, pending_bytes=w.pending_bytes - fetched)
            for w in network.workers
            if w.pending_bytes - fetched > 0
        )
    else:
        workers = ()
    return replace(network, workers=workers, last_change_s=now_s)


def meets_deadlines(network: ServerNetwork, num_fetching: int, now_s: float) -> bool:
    """Eq. 3 for every worker: S_i <= B/num_fetching × (D_i − T)."""
    share = network.bandwidth_bytes_per_s / num_fetching
    return all(
        w.pending_bytes <= share * (w.deadline_s - now_s) + DEADLINE_TOLERANCE_BYTES
        for w in network.workers
    )


def share_for_new_worker_gbps(network: ServerNetwork, now_s: float) -> float:
    """Alg. 2 GETNODEBANDWIDTH: B/(N+1) if every fetching worker still meets its deadline
    at that share (Eq. 3, with pending sizes brought up to `now_s` by Eq. 4), else 0."""
    current = handle_bandwidth_change(network, now_s)
    num_fetching = len(current.workers) + 1
    if not meets_deadlines(current, num_fetching, now_s):
        return 0.0
    return network.bandwidth_gbps / num_fetching


def admit_worker(
    network: ServerNetwork, worker: FetchingWorker, now_s: float
) -> ServerNetwork | None:
    """Place `worker` here if Eq. 3 holds for the workers already fetching; None if not.

    The bandwidth share changes, so pending sizes are first advanced by Eq. 4."""
    current = handle_bandwidth_change(network, now_s)
    if any(w.worker_id == worker.worker_id for w in current.workers):
        raise SurgeError(f"worker {worker.worker_id} already fetches on {network.server_id}")
    if not meets_deadlines(current, len(current.workers) + 1, now_s):
        return None
    return replace(current, workers=(*current.workers, worker))


def admit_background(
    network: ServerNetwork, worker_id: str, pending_bytes: float, now_s: float
) -> ServerNetwork:
    """A consolidating worker starts loading the rest of its model in the background
    (§5.2 Fig. 6(b), §6.1): it fetches through this server's NIC like a cold-start worker,
    so it takes a share B/N (new workers see B/(N+1)), but it has no TTFT deadline
    (D = infinity: Eq. 3 never refuses a new worker on its account) and it is admitted
    whatever the others' deadlines (it was decided when its group consolidated)."""
    current = handle_bandwidth_change(network, now_s)
    if any(w.worker_id == worker_id for w in current.workers):
        raise SurgeError(f"worker {worker_id} already fetches on {network.server_id}")
    worker = FetchingWorker(worker_id, math.inf, pending_bytes)
    return replace(current, workers=(*current.workers, worker))


def finish_worker(network: ServerNetwork, worker_id: str, now_s: float) -> ServerNetwork:
    """A worker stops fetching (done or cancelled): Eq. 4 first, then it leaves."""
    current = handle_bandwidth_change(network, now_s)
    return replace(current, workers=tuple(w for w in current.workers if w.worker_id != worker_id))


def contention_adjusted_servers(
    servers: tuple[GpuServer, ...], networks: dict[int, ServerNetwork], now_s: float
) -> tuple[GpuServer, ...]:
    """`servers` with each network bandwidth set to what a new worker would get there
    (0 where admitting one would break a deadline); servers without state keep theirs."""
    out = []
    for server in servers:
        network = networks.get(server.server_id)
        if network is not None:
            server = replace(server, network_gbps=share_for_new_worker_gbps(network, now_s))
        out.append(server)
    return tuple(out)


def fetch_deadline_s(
    now_s: float, ttft_slo_s: float, predicted_ttft_s: float, predicted_fetch_s: float
) -> float:
    """D_i from the TTFT prediction (§4.2.1): the predicted fetch end plus the slack the
    prediction leaves under the SLO, i.e. the latest fetch end that still meets it."""
    return now_s + predicted_fetch_s + (ttft_slo_s - predicted_ttft_s)


def place_cold_start(
    request: SizingRequest, networks: dict[int, ServerNetwork], model_id: str, now_s: float
) -> tuple[SizingDecision | None, dict[int, ServerNetwork]]:
    """Alg. 1 on the shares Alg. 2 offers, then each chosen worker is admitted where it
    runs, fetching M/s bytes with the deadline its TTFT prediction allows. Worker ids are
    `<model_id>/<server id>`. Returns the decision and the updated network states."""
    servers = contention_adjusted_servers(request.servers, networks, now_s)
    decision = select_parallelism(replace(request, servers=servers))
    if decision is None:
        return None, networks
    by_id = {s.server_id: s for s in servers}
    part = fetch_bytes(request, decision.pipeline_size)
    updated = dict(networks)
    for server_id in decision.servers:
        network = updated.get(server_id)
        if network is None:
            continue
        fetch_s = transfer_s(part, by_id[server_id].network_gbps)
        deadline = fetch_deadline_s(now_s, request.ttft_slo_s, decision.ttft_s, fetch_s)
        worker = FetchingWorker(f"{model_id}/{server_id}", deadline, part)
        placed = admit_worker(network, worker, now_s)
        if placed is None:  # the share was offered at this same instant: a bug
            raise AssertionError(f"server {server_id} refused a worker it offered a share to")
        updated[server_id] = placed
    return decision, updated
