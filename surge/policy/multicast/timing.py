"""Seconds from steps: run a step plan on real link speeds and compare it to the optimum.

In: a `Plan`, its `Pipeline`s and a `TimingModel` (cluster bandwidths, block sizes,
per-transfer overhead).
Out: a `Timeline`: when every transfer starts and ends, when each node holds each
block, when the multicast completes, when the first new serving capacity exists, and
lower bounds no plan can beat.

Execution is self-timed, as node agents run a plan: each node sends its transfers in
plan order and receives its transfers in plan order; a transfer starts once its block
is at the sender, the sender's egress is free and the receiver's ingress is free, and
takes overhead + bits / min(sender egress, receiver ingress) (NVLink speed inside a
group). On uniform links every transfer takes the same block time, so a plan of S steps
takes at most S block times, exactly S for the binomial plan.

Speed (issue 12): durations are computed for all transfers at once (numpy); a plan of
wide steps runs one step at a time in numpy (its transfers are independent: each
reads only earlier steps), a plan of narrow steps (naive) in a plain loop. Both do
the same float operations as one transfer at a time, so the seconds are identical.
"""

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from surge.errors import SurgeError
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.pipelines import Pipeline
from surge.policy.multicast.plan import Plan, Transfer

BITS_PER_BYTE = 8
BITS_PER_GBIT = 1e9


@dataclass(frozen=True)
class TimingModel:
    """Links and block sizes that turn steps into seconds. Validated at construction."""

    cluster: Cluster
    """Per-node egress/ingress bandwidth and NVLink groups."""
    block_bytes: tuple[int, ...]
    """Size of each block in bytes, in layer order (B entries, each > 0)."""
    transfer_overhead_s: float = 0.0
    """Fixed cost of every transfer (setup, RDMA post, completion), seconds, >= 0."""

    def __post_init__(self) -> None:
        if not self.block_bytes or any(b <= 0 for b in self.block_bytes):
            raise SurgeError("block sizes must be one positive byte count per block")
        if self.transfer_overhead_s < 0:
            raise SurgeError(f"transfer overhead must be >= 0 s (got {self.transfer_overhead_s})")

    @classmethod
    def uniform_blocks(
        cls,
        cluster: Cluster,
        num_blocks: int,
        block_bytes: int,
        transfer_overhead_s: float = 0.0,
    ) -> "TimingModel":
        """B blocks of `block_bytes` each."""
        return cls(cluster, (block_bytes,) * num_blocks, transfer_overhead_s)

    @property
    def num_blocks(self) -> int:
        """B, the number of blocks sized."""
        return len(self.block_bytes)

    def transfer_s(self, src: int, dst: int, block: int) -> float:
        """Seconds one transfer of `block` from src to dst takes."""
        gbps = self.cluster.link_gbps(src, dst)
        bits = self.block_bytes[block] * BITS_PER_BYTE
        return self.transfer_overhead_s + bits / (gbps * BITS_PER_GBIT)


@dataclass(frozen=True)
class TimedTransfer:
    """A transfer of the plan with its place in time."""

    step: int
    """Step of the plan it belongs to (from 1)."""
    transfer: Transfer
    """Who sends which block to whom."""
    start_s: float
    """When it starts, seconds from the start of the scale-out."""
    end_s: float
    """When the block has arrived."""


@dataclass(frozen=True)
class Timeline:
    """A plan run on a `TimingModel`."""

    transfers: tuple[TimedTransfer, ...]
    """Every transfer with start and end, in plan order."""
    arrival_s: tuple[tuple[float, ...], ...]
    """arrival_s[node][block]: when the node holds the block (0 on sources)."""
    complete_s: float
    """When every node holds every block."""
    first_pipeline_s: float
    """When new serving capacity first exists: the first pipeline is ready, or a
    destination holds the whole model, whichever is sooner."""
    optimal_s: float
    """Lower bound on complete_s over all plans (`complete_lower_bound_s`)."""
    optimal_first_pipeline_s: float
    """Lower bound on first_pipeline_s over all plans (`first_capacity_lower_bound_s`)."""


def _check_fits(plan: Plan, model: TimingModel) -> None:
    if model.cluster.num_nodes != plan.num_nodes or model.num_blocks != plan.num_blocks:
        raise SurgeError(
            f"timing model covers {model.cluster.num_nodes} nodes x {model.num_blocks} blocks, "
            f"plan has {plan.num_nodes} x {plan.num_blocks}"
        )


_NUMPY_MIN_STEP_WIDTH = 32
"""Mean transfers per step from which stepping in numpy beats a plain loop (measured)."""


def transfer_seconds(
    model: TimingModel, src: np.ndarray, dst: np.ndarray, block: np.ndarray
) -> np.ndarray:
    """`model.transfer_s` of many transfers at once (same float operations)."""
    cluster = model.cluster
    egress = np.asarray(cluster.egress_gbps, dtype=np.float64)
    ingress = np.asarray(cluster.ingress_gbps, dtype=np.float64)
    gbps = np.minimum(egress[src], ingress[dst])
    if cluster.nvlink_groups:
        group = np.full(cluster.num_nodes, -1, dtype=np.int64)
        for number, members in enumerate(cluster.nvlink_groups):
            group[list(members)] = number
        inside = (group[src] >= 0) & (group[src] == group[dst])
        gbps = np.where(inside, float(cluster.nvlink_gbps), gbps)
    bits = np.asarray(model.block_bytes, dtype=np.int64)[block] * BITS_PER_BYTE
    return model.transfer_overhead_s + bits / (gbps * BITS_PER_GBIT)


def _run_numpy(
    plan: Plan, duration_s: np.ndarray, arrival: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Self-timed run, one step at a time; fills `arrival` (flat N*B), returns start/end."""
    arr, b = plan.arrays, plan.num_blocks
    src, dst = arr.src, arr.dst
    src_cell, dst_cell = src * b + arr.block, dst * b + arr.block
    egress_free = np.zeros(plan.num_nodes)
    ingress_free = np.zeros(plan.num_nodes)
    start_s = np.empty(src.size)
    end_s = np.empty(src.size)
    bounds = arr.step_starts.tolist()
    for first, stop in itertools.pairwise(bounds):
        s, d = src[first:stop], dst[first:stop]
        start = np.maximum(
            np.maximum(arrival[src_cell[first:stop]], egress_free[s]), ingress_free[d]
        )
        end = start + duration_s[first:stop]
        egress_free[s] = end
        ingress_free[d] = end
        arrival[dst_cell[first:stop]] = end  # each (node, block) arrives once
        start_s[first:stop] = start
        end_s[first:stop] = end
    return start_s, end_s


def _run_loop(
    plan: Plan, duration_s: np.ndarray, arrival: list[float]
) -> tuple[list[float], list[float]]:
    """Self-timed run, one transfer at a time; fills `arrival` (flat N*B)."""
    arr, b = plan.arrays, plan.num_blocks
    egress_free = [0.0] * plan.num_nodes
    ingress_free = [0.0] * plan.num_nodes
    starts = [0.0] * arr.src.size
    ends = [0.0] * arr.src.size
    transfers = zip(
        arr.src.tolist(),
        arr.dst.tolist(),
        (arr.src * b + arr.block).tolist(),
        (arr.dst * b + arr.block).tolist(),
        duration_s.tolist(),
        strict=True,
    )
    for i, (src, dst, src_cell, dst_cell, took) in enumerate(transfers):
        start = arrival[src_cell]  # max(block there, egress free, ingress free)
        if egress_free[src] > start:
            start = egress_free[src]
        if ingress_free[dst] > start:
            start = ingress_free[dst]
        end = start + took
        egress_free[src] = ingress_free[dst] = arrival[dst_cell] = ends[i] = end
        starts[i] = start
    return starts, ends


def simulate(plan: Plan, pipelines: tuple[Pipeline, ...], model: TimingModel) -> Timeline:
    """Self-timed execution of `plan` on `model` (see module docstring).

    `plan` must obey the step model (as every `make_plan` result does): then the
    transfers of one step never read what another transfer of that step writes.
    """
    _check_fits(plan, model)
    n, b, k = plan.num_nodes, plan.num_blocks, plan.num_sources
    arr = plan.arrays
    duration_s = transfer_seconds(model, arr.src, arr.dst, arr.block)
    arrival = np.full(n * b, math.inf)
    arrival[: k * b] = 0.0
    if arr.src.size >= _NUMPY_MIN_STEP_WIDTH * max(plan.complete_step, 1):
        start_s, end_s = _run_numpy(plan, duration_s, arrival)
        starts, ends, arrival_flat = start_s.tolist(), end_s.tolist(), arrival.tolist()
    else:
        arrival_flat = arrival.tolist()
        starts, ends = _run_loop(plan, duration_s, arrival_flat)
    flat = [tr for transfers in plan.steps for tr in transfers]
    timed = tuple(map(TimedTransfer, arr.step.tolist(), flat, starts, ends))
    arrival_s = tuple(tuple(arrival_flat[v * b : (v + 1) * b]) for v in range(n))
    return Timeline(
        transfers=timed,
        arrival_s=arrival_s,
        complete_s=max(arrival_flat),
        first_pipeline_s=first_capacity_s(arrival_s, pipelines, k),
        optimal_s=complete_lower_bound_s(model, k),
        optimal_first_pipeline_s=first_capacity_lower_bound_s(model, k),
    )


def first_capacity_s(
    arrival_s: Sequence[Sequence[float]], pipelines: Sequence[Pipeline], num_sources: int
) -> float:
    """When new serving capacity first exists, given when each node holds each block:
    the first pipeline whose stages hold their blocks, or the first destination holding
    every block. Shared by the timing model and the runtime's measured multicasts."""
    ready = [max(arrival_s[v]) for v in range(num_sources, len(arrival_s))]
    ready += [
        max(max(arrival_s[s.node][s.first_block : s.last_block + 1]) for s in p.stages)
        for p in pipelines
    ]
    return min(ready)


def _fastest_link_gbps(cluster: Cluster) -> float:
    """An upper bound on the speed of any single transfer."""
    network = min(max(cluster.egress_gbps), max(cluster.ingress_gbps))
    return max(network, cluster.nvlink_gbps) if cluster.nvlink_groups else network


def _port_gbps(model: TimingModel, node: int, nic_gbps: float) -> float:
    """Fastest a port of `node` with a NIC of `nic_gbps` can move a block (NVLink counts)."""
    if model.cluster.nvlink_group_of(node) is not None:
        return max(nic_gbps, model.cluster.nvlink_gbps)
    return nic_gbps


def _block_times_s(model: TimingModel, gbps: float) -> list[float]:
    """Least time each block takes through a port of `gbps`, in block order."""
    return [
        model.transfer_overhead_s + size * BITS_PER_BYTE / (gbps * BITS_PER_GBIT)
        for size in model.block_bytes
    ]


def _first_sends_s(model: TimingModel, num_sources: int) -> list[float]:
    """Per block, the least time any source takes to send it.

    A block's time only falls as the port gets faster (float rounding is monotone),
    so the fastest source port gives the minimum for every block.
    """
    cluster = model.cluster
    fastest = max(_port_gbps(model, s, cluster.egress_gbps[s]) for s in range(num_sources))
    return _block_times_s(model, fastest)


def complete_lower_bound_s(model: TimingModel, num_sources: int) -> float:
    """No plan in the one-port model completes sooner than this.

    The max of three bounds (uniform links, K = 1: all equal (B + ceil(log2 N) - 1) x
    block time, which the binomial plan reaches):
    - spread: a transfer takes >= tau (smallest block on the fastest link), so by time
      s*tau at most K*2^s nodes hold anything; the last node reached gets its first block
      at >= ceil(log2(N/K))*tau and then receives B-1 more, one after another;
    - ingress: every destination receives all B blocks, one after another;
    - egress (K = 1): the source sends each block once, then the last block it sends
      needs ceil(log2 N) - 1 more doublings; (K > 1): the sources share sending each
      block once.
    """
    cluster = model.cluster
    n, b = cluster.num_nodes, model.num_blocks
    tau = model.transfer_overhead_s + min(model.block_bytes) * BITS_PER_BYTE / (
        _fastest_link_gbps(cluster) * BITS_PER_GBIT
    )
    rounds = math.ceil(math.log2(n / num_sources) - 1e-12)
    # Destinations with the same receive port share their sums (computed once per speed).
    sums: dict[float, tuple[float, float]] = {}
    for v in range(num_sources, n):
        gbps = _port_gbps(model, v, cluster.ingress_gbps[v])
        if gbps not in sums:
            times = sorted(_block_times_s(model, gbps))
            sums[gbps] = (sum(times[: b - 1]), sum(times))
    spread = rounds * tau + min(all_but_last for all_but_last, _ in sums.values())
    ingress = max(total for _, total in sums.values())
    first_sends = _first_sends_s(model, num_sources)
    if num_sources == 1:
        egress = sum(first_sends) + max(rounds - 1, 0) * tau
    else:
        egress = sum(first_sends) / num_sources
    return max(spread, ingress, egress)


def first_capacity_lower_bound_s(model: TimingModel, num_sources: int) -> float:
    """No plan gives the destinations a whole model (in one node or a pipeline) sooner.

    Every block must leave some source once before destinations can hold it, so some
    source sends >= ceil(B/K) distinct blocks one after another (λScale §4.2: b/k steps).
    """
    b = model.num_blocks
    first_sends = sorted(_first_sends_s(model, num_sources))
    return sum(first_sends[: -(-b // num_sources)])
