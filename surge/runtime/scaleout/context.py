"""What one scale-out is given, what it reports, and how its endpoints are named.

What flows: the controller (`control/scaleouts.py` `start_scale_out`) builds a
`ScaleOutContext` — the deployment's `Server`, manifest and system (`policy.systems`),
the destinations placement chose (each with its own best tier), the complete copies
elsewhere, the ParaServe spare slots, the SLOs and link speed, each node's reported links
(caps, host group) and its `ControllerSide` (the few things only the controller can do:
book a slot, make a host copy, hear that a local instance serves, say what each egress
carries).
The context is frozen: the one mutable part is its `ScaleOutReport`, where `run.py` and the
mechanisms record what the scale-out did (`pipelines_opened`, `kv_migrated`,
`live_prefilled`, the ParaServe group, `opened` and `retired` endpoints), which the
controller reads for its metrics and tests read to see
that a strategy really ran. Endpoint names are made here and only here.
"""

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from surge.config import EngineConfig
from surge.events import NO_BUS, EventBus, PipelineOpened
from surge.model.manifest import Manifest
from surge.policy.blitzscale.live_scaling import LoadRatio
from surge.policy.copies.mate_copies import MateOpen
from surge.policy.flexpipe.hrg import ScalingMark
from surge.policy.multicast.group_block_bound import GroupBlockBound
from surge.policy.multicast.pipelines import Pipeline
from surge.policy.multicast.topology import NodeLinks, NodeTraffic
from surge.policy.paraserve.group_plan import GroupPlan
from surge.policy.paraserve.predictor import ConsolidationDecision
from surge.policy.slo import Slo
from surge.policy.startup import Copy, Destination
from surge.policy.systems import SystemConfig
from surge.runtime.client import ClusterClient
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.multicast import MulticastResult
from surge.runtime.scaleout.estimates import DEFAULT_FETCH_GBPS, HOST_ESTIMATES, ServingEstimates
from surge.runtime.server import Server


def instance_name(model: str, node: int) -> str:
    """The local instance of `model` on `node` (one per node and model)."""
    return f"{model}-node{node}"


def pipeline_name(model: str, mc_id: str, index: int) -> str:
    """Execution pipeline `index` of multicast `mc_id` (unique across scale-outs)."""
    return f"{model}-pipe{index}-{mc_id}"


def group_name(model: str, members: tuple[int, ...]) -> str:
    """A ParaServe pipeline group on `members` (stage order)."""
    return f"{model}-pgroup-{'-'.join(map(str, members))}-{time.monotonic_ns()}"


def flexpipe_name(model: str) -> str:
    """A FlexPipe pipeline of `model` (its stages change; its name does not)."""
    return f"{model}-flex-{time.monotonic_ns()}"


def layer_span(manifest: Manifest, first_block: int, last_block: int) -> tuple[int, int]:
    """[first_layer, end_layer) covered by blocks first_block..last_block."""
    return manifest.blocks[first_block].first_layer, manifest.blocks[last_block].end_layer


def stage_layers(
    manifest: Manifest, pipeline: Pipeline, agents: list[int] | None = None
) -> list[tuple[int, int, int]]:
    """(agent, first_layer, end_layer) of each stage of a planned pipeline; plan node i is
    played by `agents[i]` (default: agent i)."""
    return [
        (
            s.node if agents is None else agents[s.node],
            *layer_span(manifest, s.first_block, s.last_block),
        )
        for s in pipeline.stages
    ]


def held_layers(manifest: Manifest, blocks: set[int]) -> int:
    """Layers 0..n-1 a node can run: the end layer of its longest block prefix."""
    k = 0
    while k in blocks:
        k += 1
    return manifest.blocks[k - 1].end_layer if k else 0


async def _no_host_copy(node: int) -> None:
    raise RuntimeError(f"no make_host_copy hook: node {node} cannot lead a cold start")


async def _nothing(node: int) -> None:
    return None


class ControllerSide(Protocol):
    """What only the controller can do for one scale-out, called back by the runtime (the
    runtime never imports control/): the controller's `control/scaleout_side.py`
    `DeploymentSide`, or `ControllerHooks` where a scale-out runs without a controller."""

    async def on_local(self, node: int, ep: LocalEndpoint) -> None:
        """A node serves alone now (the controller records the endpoint on its slot)."""

    async def make_host_copy(self, node: int) -> None:
        """Bring the model into a node's host tier from its disk or the registry (a cold
        leader); the controller accounts the host cache."""

    def keep_host_copy(self, node: int) -> bool:
        """Whether a load into the node's GPU memory from its disk or the registry goes
        through its host tier and stays there (ServerlessLLM's LRU cache); the controller
        makes room and accounts the host cache. A True is followed by `host_copy_done`."""

    def host_copy_done(self, node: int) -> None:
        """The load that `keep_host_copy` let keep a host copy on the node ended (landed or
        failed): the copy stops holding its room as an arriving one."""

    def book(self, node: int) -> bool:
        """Take a free slot on a spare node for a group member (False: gone)."""

    async def release(self, node: int) -> None:
        """Give back a booked member's slot (it did not become an instance)."""

    def sending(self, nodes: tuple[int, ...], delta: int) -> None:
        """Nodes whose instance starts (+1) or stops (-1) sending its GPU copy to a
        multicast: busy meanwhile, and later start-ups rank it by the egress it has left."""

    def host_sending(self, nodes: tuple[int, ...], delta: int) -> None:
        """Nodes whose host copy starts (+1) or stops (-1) sending to a multicast: their
        NIC is held meanwhile, so later start-ups rank them by the egress left."""

    def traffic(self) -> Mapping[int, NodeTraffic]:
        """What each node's egress carries now (P/D prefill instances, K/V hand-offs out),
        asked when a multicast is planned: `policy.multicast.topology` prunes busy sources."""

    def receiving(self, nodes: tuple[int, ...], now: bool) -> None:
        """Nodes whose new instance starts (True) or stops (False) receiving a multicast: a
        chain tail meanwhile (`policy.startup` tier `loading`)."""

    def scaling_marks(self) -> tuple[ScalingMark, ...]:
        """The cluster's recent scaling events (FlexPipe §7's HRG markers)."""

    def mark_scaling(self, marks: tuple[ScalingMark, ...]) -> None:
        """Servers a FlexPipe group was just placed on (their links load its stages)."""


@dataclass(frozen=True)
class ControllerHooks:
    """A `ControllerSide` made of callables, for a scale-out run without a controller
    (tests, benchmarks); what is not given does nothing."""

    on_local: Callable[[int, LocalEndpoint], Awaitable[None]]
    """A node serves alone now (the controller records the endpoint on its slot)."""
    make_host_copy: Callable[[int], Awaitable[None]] = _no_host_copy
    """Bring the model into a node's host tier from its disk or the registry (cold
    leader); the controller accounts the host cache."""
    keep_host_copy: Callable[[int], bool] = lambda node: False
    """Whether a load into the node's GPU memory from its disk or the registry keeps a
    host copy (ServerlessLLM's LRU cache)."""
    host_copy_done: Callable[[int], None] = lambda node: None
    """The load that kept a host copy on the node ended (landed or failed)."""
    book: Callable[[int], bool] = lambda node: False
    """Take a free slot on a spare node for a ParaServe group member (False: gone)."""
    release: Callable[[int], Awaitable[None]] = _nothing
    """Give back a booked member's slot (it did not become an instance)."""
    sending: Callable[[tuple[int, ...], int], None] = lambda nodes, delta: None
    """Nodes whose instance starts (+1) or stops (-1) sending its GPU copy to a multicast
    (a source, a chain tail, or a receiver forwarding within the plan): the autoscaler
    counts it busy meanwhile, and later start-ups rank it by the egress it has left."""
    host_sending: Callable[[tuple[int, ...], int], None] = lambda nodes, delta: None
    """Nodes whose host copy starts (+1) or stops (-1) sending to a multicast (its NIC held)."""
    traffic: Callable[[], Mapping[int, NodeTraffic]] = dict
    """What each node's egress carries now (P/D prefill instances, K/V hand-offs out),
    asked when a multicast is planned: `policy.multicast.topology` prunes busy sources."""
    receiving: Callable[[tuple[int, ...], bool], None] = lambda nodes, now: None
    """Nodes whose new instance starts (True) or stops (False) receiving a multicast: a
    chain tail meanwhile (`policy.startup` tier `loading`)."""
    scaling_marks: Callable[[], tuple[ScalingMark, ...]] = tuple
    """The cluster's recent scaling events (FlexPipe §7's HRG markers)."""
    mark_scaling: Callable[[tuple[ScalingMark, ...]], None] = lambda marks: None
    """Servers a FlexPipe group was just placed on."""


@dataclass
class ScaleOutReport:
    """What one scale-out did: the controller reads it for its metrics, tests to see that a
    strategy really ran (filled even when the scale-out fails part way)."""

    kind: str | None = None
    """`hot`, `warm` or `cold` (the start-up plan's kind)."""
    sources: tuple[int, ...] = ()
    """Multicast sources used (plan nodes 0..K-1)."""
    multicast: MulticastResult | None = None
    """The multicast's result (arrivals, completion, re-plans), if one ran."""
    pipelines_opened: int = 0
    kv_migrated: int = 0
    """Requests moved with their KV cache (ParaServe consolidation)."""
    consolidated: int = 0
    """ParaServe groups consolidated onto their kept members (§6.1), whether their requests
    moved with their KV cache or were routed again."""
    live_prefilled: int = 0
    """Requests prefilled cooperatively by live scaling (BlitzScale)."""
    live_batches: dict[str, int] = field(default_factory=dict)
    """Live-scaled batches per §5.2 schedule that gave their split ("zigzag", "best_effort")."""
    live_declined: int = 0
    """Looks at a non-empty queue where the SLO check said normal routing meets the TTFT SLO."""
    live_load_ratios: list[LoadRatio] = field(default_factory=list)
    """Eq. 1's Time_l of each live-scaling schedule made (measured or the fallback)."""
    live_redistributed: int = 0
    """Requests moved to a new instance once it held every layer (§5.2 step 3)."""
    live_spans: list[tuple[int, str, tuple[tuple[int, float, float], ...]]] = field(
        default_factory=list
    )
    """(batch number, schedule, its stages' (node, start, end) compute spans) of each
    live batch: the target's and the source's work on different batches overlaps
    (Fig. 12b) where a batch's source span meets a later batch's target span."""
    live_woken: int = 0
    """Looks made at once because a layer landed that a pending batch waited for (§5.2
    (2) preemption), not at the poll."""
    opened: list[tuple[str, float, tuple[int, ...]]] = field(default_factory=list)
    """(endpoint, monotonic time, nodes) in the order endpoints opened."""
    retired: list[tuple[str, float, int]] = field(default_factory=list)
    """(pipeline, monotonic time, requests moved) for every mode switch."""
    groups: list[GroupPlan] = field(default_factory=list)
    """ParaServe's groups (Alg. 2 + Alg. 1), one per instance wanted."""
    consolidations: list[ConsolidationDecision] = field(default_factory=list)
    """ParaServe's §6.1 decision for each group, in the same order."""
    prefetched: list[tuple[int, float, float]] = field(default_factory=list)
    """(node, start, end on the serving clock) of each ParaServe member's background
    prefetch of the rest into its host tier (§5 Fig. 6(b), `policy.paraserve.prefetch`)."""
    mate_opens: tuple[MateOpen, ...] = ()
    """Destinations that opened a host mate's device copy (`policy.copies.mate_copies`)."""


@dataclass(frozen=True)
class ScaleOutContext:
    """Everything one scale-out is given (the request record: frozen), its controller side,
    and its `report`."""

    client: ClusterClient
    server: Server
    manifest: Manifest
    system: SystemConfig
    destinations: tuple[Destination, ...]
    """The new instances' nodes, placement order, each with its own best tier."""
    hooks: ControllerSide
    copies: tuple[Copy, ...] = ()
    """Complete copies elsewhere (GPU and host copies, each with its machine:
    `policy.startup` sends from one per machine)."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    timeout_s: float = 120.0
    serve_while_loading: bool = True
    """False: multicast receivers serve only once whole; the controller sets it when
    another multicast of the same model still runs."""
    spares: tuple[Destination, ...] = ()
    """Nodes with a free slot, other than the destinations (each with its own best tier),
    that a ParaServe group may book (`hooks.book`) for its extra members."""
    fetching: dict[int, int] = field(default_factory=dict)
    """Workers fetching on each node now, other than this scale-out's (ParaServe Alg. 2's
    contention; their deadlines are unknown here, so they only share the bandwidth)."""
    ttft_slo_s: float = Slo.ttft_s
    tpot_slo_s: float = Slo.tpot_s
    fetch_gbps: float = DEFAULT_FETCH_GBPS
    estimates: ServingEstimates = HOST_ESTIMATES
    """Compute rates assumed before measuring (`scaleout/estimates.py`; the emulated GPU's
    under emulation)."""
    """Network rate one worker's fetch gets (ParaServe's b_i before contention)."""
    events: EventBus = NO_BUS
    """Where what happens is published for the dashboard (`surge/events.py`)."""
    links: Mapping[int, NodeLinks] = field(default_factory=dict)
    """Each node's links as its agent reported them (NIC caps, host group); a node not in
    it is planned as uncapped and alone (`policy.multicast.topology`)."""
    device_owners: tuple[int, ...] = ()
    """Live nodes holding a complete device copy of the model of their own (not mapped from
    a host mate): a destination in one's host group opens it (`policy.copies.mate_copies`)."""
    hosted_s: Mapping[int, float] = field(default_factory=dict)
    """When each node last hosted the model (served it or took a host copy; monotonic
    s): FlexPipe's §7 Eq. 13 history (`system.place_new_group`)."""
    host_blocks: Mapping[int, frozenset[int]] = field(default_factory=dict)
    """Blocks each destination and spare holds in its host tier, complete or not: a
    FlexPipe stage whose blocks are all there loads from it (kept after a GPU eviction,
    §7; `policy.flexpipe.host_keep.stage_sources`)."""
    paced_setups: bool = False
    """Set under GPU-time emulation, where the emulated GPU's set-ups are not the host's:
    a new instance waits for its system's engine start (`init_s`) on the serving clock
    before it serves (`scaleout/local.engine_start`), and a real gloo group's creation
    lasts at least the system's `group_setup_s` on it before its first block moves
    (`scaleout/multicast.group_setup_floor_s`), each as the simulator charges it."""
    group_block_bound: GroupBlockBound = field(default_factory=GroupBlockBound)
    """How long a gloo group's member waits for one block (`multicast_transport` gloo or
    gloo-ring; `policy/multicast/group_block_bound.py`): `ControllerConfig.group_block_bound`."""
    report: ScaleOutReport = field(default_factory=ScaleOutReport)
    """What the scale-out did, written as it goes (the one mutable part)."""

    @property
    def model(self) -> str:
        return self.server.model

    @property
    def nodes(self) -> list[int]:
        return [d.node for d in self.destinations]

    def local_endpoint(self, node: int) -> LocalEndpoint:
        return LocalEndpoint(
            self.client,
            node,
            self.model,
            instance_name(self.model, node),
            capacity=self.engine.max_num_seqs,
        )

    def record_open(
        self, name: str, nodes: tuple[int, ...], stages: Sequence[tuple[int, int, int]] = ()
    ) -> None:
        """An endpoint serves; a pipeline's `stages` are (node, first_layer, end_layer)."""
        if len(nodes) > 1:
            self.report.pipelines_opened += 1
            self.events.publish(PipelineOpened(model=self.model, name=name, stages=tuple(stages)))
        self.report.opened.append((name, self.server.clock.now_s(), nodes))
