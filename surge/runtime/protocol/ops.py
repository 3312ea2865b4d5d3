"""Every request a node agent answers, as a frozen dataclass naming its reply class.

What flows: the controller (and peers) send an `Op`; the agent decodes it with `Op.decode`,
runs the handler registered for its class, and answers with the op's `REPLY` (plus
`"ok": true`), or `{"ok": false, "error": ...}`. The JSON of each op is the dict the
senders built by hand before (`"op"` key + fields), so dict senders and typed senders mix.
Defaults live here and only here. Owned by the runtime (see docs/runtime.md, Protocol).
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

from surge.engine.batch import BatchMeta
from surge.engine.sampling import Draw, SamplingParams
from surge.json_codec import Named, Registry, require
from surge.model.manifest import Manifest
from surge.policy.paraserve.prefetch import Priority
from surge.runtime.protocol.replies import (
    AbortReply,
    Ack,
    BlockReply,
    ChecksumsReply,
    DropReply,
    GenerateReply,
    HandoffReply,
    InstanceReply,
    LayerTimesReply,
    LoadReply,
    MulticastReply,
    PipelineReply,
    QueuedReply,
    RegisterReply,
    Reply,
    SetPeersReply,
    StageStepReply,
    StatusReply,
    SubmitReply,
)

Tier = Literal["host", "gpu", "disk"]
"""Where blocks are held: shared host memory, the engine's (gpu) buffers, local disk."""
LandingTier = Literal["host", "gpu"]
"""Tiers a block can be received into over the network."""
Source = Literal["disk", "host", "remote", "mate"]
"""Where blocks come from: local disk, this node's host copy, the registry (what `load`
reads), or a host mate's device copy (`open_mate_copy`, announced with this source)."""

MULTICAST_WAIT_S = 120.0
"""How long a receiver's pull waits for its source to hold the block (multicast,
pull_from). A pull in a plan may be issued long before its source has the block."""
NO_STEP = 1e9
"""The plan step of a `get_block` outside any plan: served after every planned send."""


# ---- ops -----------------------------------------------------------------------------

R = TypeVar("R", bound=Reply)

OPS = Registry("op", "op")
"""Op name -> its class. Filled by each class definition."""


@dataclass(frozen=True)
class Op(Named, Generic[R]):
    """A request to an agent. Subclasses name themselves: `class X(Op[Y], name=..., reply=Y)`;
    `Op.decode(header)` gives the typed op of a request header (a SurgeError names an
    unknown op or a bad field)."""

    REGISTRY: ClassVar[Registry] = OPS
    REPLY: ClassVar[type[Reply]] = Ack
    STRICT: ClassVar[bool] = True

    def __init_subclass__(cls, name: str = "", reply: type[Reply] = Ack, **kw: Any) -> None:
        super().__init_subclass__(name=name, **kw)
        if name:
            cls.REPLY = reply


def _blocks_ok(where: str, blocks: tuple[int, ...]) -> None:
    require(all(b >= 0 for b in blocks), where, f"block indices must be >= 0 (got {blocks})")


@dataclass(frozen=True)
class SubscribeOp(Op[Ack], name="subscribe"):
    """Turn this connection into the agent's event stream (answered with an `Ack`)."""


@dataclass(frozen=True)
class ShutdownOp(Op[Ack], name="shutdown"):
    """Stop the agent."""


@dataclass(frozen=True)
class StatusOp(Op[StatusReply], name="status", reply=StatusReply):
    """What this node holds, its traffic counters and peers."""


@dataclass(frozen=True)
class RegisterOp(Op[RegisterReply], name="register", reply=RegisterReply):
    """Learn a model's manifest: sent inline, or (None) read from the agent's registry."""

    model: str
    manifest: Manifest | None = None


@dataclass(frozen=True)
class SetPeersOp(Op[SetPeersReply], name="set_peers", reply=SetPeersReply):
    """Peer addresses by node id; `preconnect` opens the pool at once (BlitzScale §5.3)."""

    peers: dict[int, tuple[str, int]]
    preconnect: bool = True


@dataclass(frozen=True)
class LoadOp(Op[LoadReply], name="load", reply=LoadReply):
    """Read blocks from `source` into `tier`, in order."""

    model: str
    blocks: tuple[int, ...]
    tier: Tier = "host"
    source: Source = "disk"
    priority: Priority = "critical"
    """`background`: a read from the registry also crosses the node's NIC (its ingress
    cap), taking only the bandwidth inference traffic leaves (ParaServe §4.2; the node
    prefetcher's rest, `policy.paraserve.prefetch`)."""
    keep_host: bool = False
    """With tier `gpu` from `disk` or `remote`: each block is read into the host tier and
    copied to the gpu tier from there, and stays (announced in both tiers): ServerlessLLM's
    loading path through host memory, which leaves its LRU cache filled
    (`policy.copies.host_copies.copy_after_load`)."""

    def __post_init__(self) -> None:
        _blocks_ok("op load", self.blocks)
        require(self.source != "mate", "op load", "a mate's device copy is open_mate_copy's")
        ok = not self.keep_host or (self.tier == "gpu" and self.source in ("disk", "remote"))
        require(ok, "op load", "keep_host is for a gpu load from disk or remote")


@dataclass(frozen=True)
class EvictOp(Op[Ack], name="evict"):
    model: str
    blocks: tuple[int, ...]
    tier: Tier = "host"
    keep_host: bool = False
    """With tier `gpu`: the blocks go to the host tier before they are freed (a GPU ->
    host copy, announced as `arrival`s in `host`; FlexPipe §7 host copies kept after GPU
    eviction, `policy.flexpipe.host_keep`). No room in shared memory: they are freed only."""

    def __post_init__(self) -> None:
        _blocks_ok("op evict", self.blocks)
        require(not self.keep_host or self.tier == "gpu", "op evict", "keep_host is for gpu")


@dataclass(frozen=True)
class DropModelOp(Op[DropReply], name="drop_model", reply=DropReply):
    """Forget a model on this node at once (its deployment was deleted): every op about it
    still running here is aborted (a load stops at its next chunk), its instances and
    pipeline stages close, and every copy of it goes from every tier, with its manifest
    (a later `register` starts afresh)."""

    model: str


@dataclass(frozen=True)
class ChecksumsOp(Op[ChecksumsReply], name="checksums", reply=ChecksumsReply):
    model: str


@dataclass(frozen=True)
class GenerateOp(Op[GenerateReply], name="generate", reply=GenerateReply):
    """Generate with this node's gpu-tier blocks (tests and checks; no batching)."""

    model: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True)
class GetBlockOp(Op[BlockReply], name="get_block", reply=BlockReply):
    """A peer's pull of one block; served in plan-step order by the egress port."""

    model: str
    block: int
    step: float = NO_STEP
    wait_s: float = 0.0
    """How long to wait for the block to be held (0: answer at once)."""
    digest: str = ""
    """The version the puller holds the model at (`Manifest.digest`): a peer holding another
    version refuses, no byte of it sent ("": any, a caller that does not say)."""

    def __post_init__(self) -> None:
        require(self.block >= 0 and self.wait_s >= 0, "op get_block", "needs block, wait_s >= 0")


@dataclass(frozen=True)
class MulticastOp(Op[MulticastReply], name="multicast", reply=MulticastReply):
    """This node's part of a plan: pull `recv` = (step, block, source node) in step order."""

    mc_id: str
    model: str
    recv: tuple[tuple[int, int, int], ...]
    tier: LandingTier = "host"
    wait_s: float = MULTICAST_WAIT_S

    def __post_init__(self) -> None:
        require(self.wait_s > 0, "op multicast", f"wait_s must be > 0 (got {self.wait_s})")
        _blocks_ok("op multicast", tuple(b for _, b, _ in self.recv))


@dataclass(frozen=True)
class PullFromOp(Op[Ack], name="pull_from"):
    """A re-planned delivery: pull `block` from `src` now (after a `pull_failed`)."""

    mc_id: str
    model: str
    block: int
    src: int
    tier: LandingTier = "host"
    step: float = 0.0
    wait_s: float = MULTICAST_WAIT_S

    def __post_init__(self) -> None:
        _blocks_ok("op pull_from", (self.block,))


@dataclass(frozen=True)
class StageOpenOp(Op[PipelineReply], name="stage_open", reply=PipelineReply):
    """Open layers [first_layer, end_layer) of a pipeline here; `next_node` runs the rest
    (None: this stage is the last: it picks each step's tokens and returns them)."""

    pipeline: str
    model: str
    first_layer: int
    end_layer: int
    next_node: int | None = None
    compute_group: str | None = None
    """Stages opened here with the same group compute one step at a time, in arrival
    order (a live target runs its batches' layers one batch after another, BlitzScale
    Fig. 12b); None: this stage alone."""
    digest: str = ""
    """The pipeline's version (`Manifest.digest`): a node holding another refuses
    (`policy.versions.refuse_stage`); "": not checked."""

    def __post_init__(self) -> None:
        span = f"{self.first_layer}..{self.end_layer}"
        ok = 0 <= self.first_layer < self.end_layer
        require(ok, "op stage_open", f"needs 0 <= first_layer < end_layer (got {span})")


@dataclass(frozen=True)
class StageStepOp(Op[StageStepReply], name="stage_step", reply=StageStepReply):
    """One micro-batch through a stage. `tokens`: int64 ids [B, Q] in the payload, with
    `shape` and `batch`; `hidden`: a hidden-states frame (engine/hidden.py) in the payload.
    `draws` go along the chain to the last stage, which picks each row's next token from
    its logits (`engine/sampling.py` `sample`) and answers token ids, not logits."""

    pipeline: str
    kind: Literal["tokens", "hidden"]
    shape: tuple[int, ...] | None = None
    batch: BatchMeta | None = None
    draws: tuple[Draw | None, ...] = ()
    """Per row, what picks its next token (None: a prompt piece, none picked); `()`: no
    row picks one (a step that only fills the caches)."""

    def __post_init__(self) -> None:
        if self.kind == "tokens":
            ok = self.shape is not None and self.batch is not None
            require(ok, "op stage_step", "kind 'tokens' needs shape and batch")
            n = self.batch.num_seqs if self.batch is not None else 0
            ok = not self.draws or len(self.draws) == n
            require(ok, "op stage_step", f"{len(self.draws)} draws for {n} rows")


@dataclass(frozen=True)
class StageFreeOp(Op[Ack], name="stage_free"):
    """Drop finished sequences along the whole chain."""

    pipeline: str
    seq_ids: tuple[int, ...]


@dataclass(frozen=True)
class StageCloseOp(Op[Ack], name="stage_close"):
    pipeline: str


@dataclass(frozen=True)
class InstanceOpenOp(Op[InstanceReply], name="instance_open", reply=InstanceReply):
    """A full local instance over the node's gpu-tier blocks (idempotent)."""

    instance: str
    model: str


@dataclass(frozen=True)
class InstanceSubmitOp(Op[SubmitReply], name="instance_submit", reply=SubmitReply):
    """Add a request; `output_token_ids` it generated elsewhere are rebuilt by prefill."""

    instance: str
    req_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    output_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class InstanceAbortOp(Op[AbortReply], name="instance_abort", reply=AbortReply):
    instance: str
    req_ids: tuple[str, ...]


@dataclass(frozen=True)
class InstanceQueuedOp(Op[QueuedReply], name="instance_queued", reply=QueuedReply):
    """The requests queued on a local instance that have not started: submitted and not
    yet in its engine, or in its engine's queue with no token generated and nothing
    cached. Answered at once, not after the step in progress."""

    instance: str


@dataclass(frozen=True)
class InstanceTakeQueuedOp(Op[QueuedReply], name="instance_take_queued", reply=QueuedReply):
    """Take back those of `req_ids` that have not started (as `instance_queued` counts
    them); answers the ones taken, which leave the instance (the rest stay and run here).
    BlitzScale §4 step 1: a live target redirects the source's queued requests; §5.2 step
    3: they go back to the router once the target serves. Does not wait for the step in
    progress (that step runs none of them)."""

    instance: str
    req_ids: tuple[str, ...]


@dataclass(frozen=True)
class InstanceCloseOp(Op[Ack], name="instance_close"):
    instance: str


@dataclass(frozen=True)
class StageProfileOp(Op[LayerTimesReply], name="stage_profile", reply=LayerTimesReply):
    """Time each layer of this node's stage of `pipeline` (FlexPipe §5 profiling)."""

    pipeline: str
    num_tokens: int = 32
    repeats: int = 2

    def __post_init__(self) -> None:
        ok = self.num_tokens >= 1 and self.repeats >= 1
        require(ok, "op stage_profile", "needs num_tokens >= 1 and repeats >= 1")


PdRole = Literal["prefill", "decode"]
"""A local instance's P/D role (`surge.policy.blitzscale.pd`)."""
HANDOFF_REASON = "handoff"
"""`TokenGenerated.finish_reason` of a request's first token on a prefill instance, with
`finished` false: the request is parked there, its K/V ready for `instance_handoff`."""


@dataclass(frozen=True)
class InstanceRoleOp(Op[Ack], name="instance_role"):
    """Set a local instance's P/D role now; a step under way ends in it (mutation,
    BlitzScale §5.2: the weights stay). A prefill instance parks each request after its
    prefill until the controller takes it (`instance_handoff`); a decode instance runs
    requests to the end."""

    instance: str
    role: PdRole


@dataclass(frozen=True)
class InstanceHandoffOp(Op[HandoffReply], name="instance_handoff", reply=HandoffReply):
    """Take a request parked after its prefill off a prefill instance, K/V in the payload."""

    instance: str
    req_id: str
