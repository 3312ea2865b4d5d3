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
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.cluster import Cluster
from surge.policy.pipelines import Pipeline
from surge.policy.plan import Plan, Transfer

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


def simulate(plan: Plan, pipelines: tuple[Pipeline, ...], model: TimingModel) -> Timeline:
    """Self-timed execution of `plan` on `model` (see module docstring)."""
    _check_fits(plan, model)
    n, b = plan.num_nodes, plan.num_blocks
    arrival = [[0.0 if v < plan.num_sources else math.inf for _ in range(b)] for v in range(n)]
    egress_free = [0.0] * n
    ingress_free = [0.0] * n
    timed: list[TimedTransfer] = []
    for step, transfers in enumerate(plan.steps, start=1):
        for tr in transfers:  # each depends only on earlier steps
            start = max(arrival[tr.src][tr.block], egress_free[tr.src], ingress_free[tr.dst])
            end = start + model.transfer_s(tr.src, tr.dst, tr.block)
            egress_free[tr.src] = end
            ingress_free[tr.dst] = end
            arrival[tr.dst][tr.block] = min(arrival[tr.dst][tr.block], end)
            timed.append(TimedTransfer(step, tr, start, end))
    complete = max(max(row) for row in arrival)
    return Timeline(
        transfers=tuple(timed),
        arrival_s=tuple(tuple(row) for row in arrival),
        complete_s=complete,
        first_pipeline_s=first_capacity_s(arrival, pipelines, plan.num_sources),
        optimal_s=complete_lower_bound_s(model, plan.num_sources),
        optimal_first_pipeline_s=first_capacity_lower_bound_s(model, plan.num_sources),
    )


def first_capacity_s(
    arrival_s: Sequence[Sequence[float]], pipelines: Sequence[Pipeline], num_sources: int
) -> float:
    """When new serving capacity first exists, given when each node holds each block:
    the first pipeline whose stages hold their blocks, or the first destination holding
    every block. Shared by the timing model and the runtime's measured multicasts."""
    ready = [max(arrival_s[v]) for v in range(num_sources, len(arrival_s))]
    ready += [
        max(arrival_s[s.node][k] for s in p.stages for k in range(s.first_block, s.last_block + 1))
        for p in pipelines
    ]
    return min(ready)


def _fastest_link_gbps(cluster: Cluster) -> float:
    """An upper bound on the speed of any single transfer."""
    network = min(max(cluster.egress_gbps), max(cluster.ingress_gbps))
    return max(network, cluster.nvlink_gbps) if cluster.nvlink_groups else network


def _port_s(model: TimingModel, node: int, block: int, nic_gbps: float) -> float:
    """Least time `node` can spend moving `block` through a port of `nic_gbps`."""
    gbps = nic_gbps
    if model.cluster.nvlink_group_of(node) is not None:
        gbps = max(gbps, model.cluster.nvlink_gbps)
    bits = model.block_bytes[block] * BITS_PER_BYTE
    return model.transfer_overhead_s + bits / (gbps * BITS_PER_GBIT)


def _recv_s(model: TimingModel, node: int, block: int) -> float:
    """Least time `node` can spend receiving `block`."""
    return _port_s(model, node, block, model.cluster.ingress_gbps[node])


def _send_s(model: TimingModel, node: int, block: int) -> float:
    """Least time `node` can spend sending `block`."""
    return _port_s(model, node, block, model.cluster.egress_gbps[node])


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
    dests = range(num_sources, n)
    tau = model.transfer_overhead_s + min(model.block_bytes) * BITS_PER_BYTE / (
        _fastest_link_gbps(cluster) * BITS_PER_GBIT
    )
    rounds = math.ceil(math.log2(n / num_sources) - 1e-12)
    recv = {v: sorted(_recv_s(model, v, k) for k in range(b)) for v in dests}
    spread = rounds * tau + min(sum(times[: b - 1]) for times in recv.values())
    ingress = max(sum(times) for times in recv.values())
    first_sends = [min(_send_s(model, s, k) for s in range(num_sources)) for k in range(b)]
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
    first_sends = sorted(min(_send_s(model, s, k) for s in range(num_sources)) for k in range(b))
    return sum(first_sends[: -(-b // num_sources)])
