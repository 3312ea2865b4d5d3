"""One call from a scale-out request to its plan, pipelines and timeline.

In: a `MulticastRequest` (N, B, K, strategy, cluster, block sizes, overhead).
Out: a `MulticastOutcome` with the validated `Plan`, its `Pipeline`s and `Timeline`.
This is the planner's front door; the CLI, the benchmark, the runtime and the
simulator all come through here.
"""

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field

from surge.errors import SurgeError
from surge.policy.multicast.baselines import BINARY_TREE, NAIVE, plan_binary_tree, plan_naive
from surge.policy.multicast.binomial import STRATEGY as BINOMIAL
from surge.policy.multicast.binomial import plan_binomial
from surge.policy.multicast.chain import STRATEGY as CHAIN
from surge.policy.multicast.chain import plan_chain
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.nvlink_replication import (
    plan_binomial_nvlink,
    replica_pipeline_groups,
    replicates_over_nvlink,
)
from surge.policy.multicast.pipelines import (
    Pipeline,
    PipelineSettings,
    pipelines_earliest,
    pipelines_kway,
    pipelines_of_groups,
)
from surge.policy.multicast.plan import Plan
from surge.policy.multicast.subgroups import check_sizes, split_subgroups
from surge.policy.multicast.timing import Timeline, TimingModel, simulate

STRATEGIES = (BINOMIAL, CHAIN, BINARY_TREE, NAIVE)
"""Every strategy name `plan_multicast` knows."""

DEFAULT_GBPS = 100.0
"""Link speed when no cluster is given (Gbit/s, every node, both directions)."""
DEFAULT_BLOCK_BYTES = 100_000_000
"""Block size when none is given (100 MB)."""

# Planner limits (issue 12), from benchmarks/scaleout/planner_speed.py: a plan holds (N-K)*B
# transfers, each a Python object twice (plan, timeline), so time and memory grow with
# that product; 16,384 nodes x 64 blocks plans in a few seconds, twice that in ~10 s
# on a busy 2-core machine. Past the limits a request fails at once with the fix.
MAX_NODES = 65_536
"""Most nodes one scale-out plan may hold."""
MAX_BLOCKS = 4_096
"""Most blocks a model may be split into (the binomial plan steps once per block)."""
MAX_BLOCK_TRANSFERS = 1 << 20
"""Most block transfers, (N - K) x B, one plan may hold (16,384 nodes x 64 blocks fit)."""


@dataclass(frozen=True)
class MulticastRequest:
    """What to plan. Validated at construction; bad values raise `SurgeError`."""

    num_nodes: int
    """N: nodes 0..N-1 take part, N >= 2."""
    num_blocks: int
    """B: blocks the model is split into, B >= 1."""
    num_sources: int = 1
    """K: nodes 0..K-1 already hold the model, 1 <= K < N."""
    strategy: str = BINOMIAL
    """One of `STRATEGIES`."""
    cluster: Cluster | None = None
    """Link speeds; None means uniform `DEFAULT_GBPS` links."""
    block_bytes: int = DEFAULT_BLOCK_BYTES
    """Size of every block in bytes (> 0)."""
    transfer_overhead_s: float = 0.0
    """Fixed cost per transfer in seconds (>= 0)."""
    pipelines: PipelineSettings = field(default_factory=PipelineSettings)
    """Limits of execution-pipeline generation."""

    def __post_init__(self) -> None:
        check_sizes(self.num_nodes, self.num_blocks, self.num_sources)
        if self.strategy not in STRATEGIES:
            raise SurgeError(
                f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}"
            )
        if self.cluster is not None and self.cluster.num_nodes != self.num_nodes:
            raise SurgeError(
                f"{self.cluster.num_nodes} bandwidths given for {self.num_nodes} nodes; "
                "give one per node"
            )
        if self.block_bytes <= 0:
            raise SurgeError(f"block size must be > 0 bytes (got {self.block_bytes})")
        check_planner_limits(self.num_nodes, self.num_blocks, self.num_sources)

    @property
    def links(self) -> Cluster:
        """The cluster, defaulting to uniform links."""
        return self.cluster or Cluster.uniform(self.num_nodes, DEFAULT_GBPS)

    @property
    def timing(self) -> TimingModel:
        """The timing model of this request."""
        return TimingModel.uniform_blocks(
            self.links, self.num_blocks, self.block_bytes, self.transfer_overhead_s
        )


@dataclass(frozen=True)
class MulticastOutcome:
    """A planned scale-out."""

    request: MulticastRequest
    """What was asked."""
    plan: Plan
    """Who sends which block to whom, step by step."""
    pipelines: tuple[Pipeline, ...]
    """Execution pipelines in the order they form."""
    timeline: Timeline
    """The plan in seconds on the request's links."""


def check_planner_limits(num_nodes: int, num_blocks: int, num_sources: int) -> None:
    """Raise `SurgeError`, naming the limit and the fix, if the plan would be too large."""
    if num_nodes > MAX_NODES:
        raise SurgeError(
            f"{num_nodes:,} nodes is over the planner's limit of {MAX_NODES:,} nodes per "
            f"scale-out; plan at most {MAX_NODES:,} nodes and split the scale-out into "
            "several (each new node can act as a source for the next)"
        )
    if num_blocks > MAX_BLOCKS:
        raise SurgeError(
            f"{num_blocks:,} blocks is over the planner's limit of {MAX_BLOCKS:,}; "
            "split the model into fewer, larger blocks"
        )
    transfers = (num_nodes - num_sources) * num_blocks
    if transfers > MAX_BLOCK_TRANSFERS:
        most_nodes = MAX_BLOCK_TRANSFERS // num_blocks + num_sources
        raise SurgeError(
            f"{num_nodes:,} nodes x {num_blocks} blocks from {num_sources} source(s) is "
            f"{transfers:,} block transfers, over the planner's limit of "
            f"{MAX_BLOCK_TRANSFERS:,} (about 10 s to plan); plan at most {most_nodes:,} "
            f"nodes with {num_blocks} blocks and split the scale-out, or use fewer, "
            "larger blocks"
        )


def plan_multicast(request: MulticastRequest) -> Plan:
    """The step plan of `request.strategy`."""
    n, b, k = request.num_nodes, request.num_blocks, request.num_sources
    if request.strategy == BINOMIAL:
        if replicates_over_nvlink(k, request.cluster):  # λScale §4.3 Case 3
            return plan_binomial_nvlink(n, b, k, request.links)
        return plan_binomial(n, b, k, request.cluster)
    if request.strategy == CHAIN:
        return plan_chain(n, b, k, request.links)
    if request.strategy == BINARY_TREE:
        return plan_binary_tree(n, b, k)
    return plan_naive(n, b, k)


def plan_pipelines(
    plan: Plan, settings: PipelineSettings | None = None, cluster: Cluster | None = None
) -> tuple[Pipeline, ...]:
    """λScale Alg. 2 for a k-way binomial plan (K > 1; with intra-node replication, one
    pipeline per local replica of each Alg. 2 group, §4.3 Case 3), earliest covers
    otherwise. `cluster`: the one the plan was made on."""
    if plan.strategy == BINOMIAL and plan.num_sources > 1:
        if cluster is not None and replicates_over_nvlink(plan.num_sources, cluster):
            groups = replica_pipeline_groups(plan.num_sources, cluster)
            return pipelines_of_groups(plan, groups, settings)
        groups = split_subgroups(plan.num_nodes, plan.num_sources)
        return pipelines_kway(plan, groups, settings)
    return pipelines_earliest(plan, settings)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a plan is built.

    A large plan is millions of small acyclic objects (transfers, timed transfers);
    the collector would walk them again and again as they are made, about a third
    of the planning time at 16,384 nodes x 64 blocks. Reference counting still frees
    everything; the collector resumes (if it was on) when planning ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def plan_scale_out(request: MulticastRequest) -> MulticastOutcome:
    """Plan, pipelines and timeline of `request`."""
    with _cyclic_gc_paused():
        plan = plan_multicast(request)
        pipelines = plan_pipelines(plan, request.pipelines, request.cluster)
        timeline = simulate(plan, pipelines, request.timing)
    return MulticastOutcome(request, plan, pipelines, timeline)
