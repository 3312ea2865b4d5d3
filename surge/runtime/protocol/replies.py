"""The replies of the agent ops (`protocol/ops.py`), as frozen dataclasses.

What flows: an agent answers an op with the header `ok_header(reply)` (and, for some,
bytes in the payload), or with `error_header(message)`; `ClusterClient.call` gives the
caller `Op.REPLY.from_json(...)`.
Replies accept keys they do not know, so an older client reads a newer agent's answer.
Owned by the runtime (see docs/runtime.md, Protocol).
"""

from dataclasses import dataclass, field
from typing import Any, Literal

from surge.engine.sampling import Sampled
from surge.json_codec import Message, require
from surge.policy.multicast.topology import NodeLinks


@dataclass(frozen=True)
class Reply(Message):
    """The fields of a successful answer (`ok_header` adds `"ok": true`)."""


def ok_header(reply: Reply) -> dict[str, Any]:
    """The frame header of a successful answer (the one place that writes it)."""
    return {"ok": True, **reply.to_json()}


def error_header(message: str) -> dict[str, Any]:
    """The frame header of a refused or failed op; `ClusterClient` raises `message`."""
    return {"ok": False, "error": message}


@dataclass(frozen=True)
class Ack(Reply):
    """An answer with no fields."""


@dataclass(frozen=True)
class ModelHolding(Reply):
    """Blocks of one model held on a node, by tier."""

    host: tuple[int, ...]
    gpu: tuple[int, ...]
    disk: tuple[int, ...]
    digest: str = ""
    """The digest of the manifest the node runs the model with (`Manifest.digest`; "": an
    agent that does not report it): a restarted controller adopts an instance only of the
    model version it serves (`policy.adoption`)."""


@dataclass(frozen=True)
class RunningHolding(Reply):
    """A local instance or a pipeline stage running on a node (its `status`), so that a
    restarted controller can adopt or close what an old one left (`policy.adoption`)."""

    name: str
    """The instance's name (`instance_open`), or the stage's pipeline (`stage_open`)."""
    model: str
    kind: Literal["instance", "stage"]
    role: str = "decode"
    """A local instance's P/D role."""
    req_ids: tuple[str, ...] = ()
    """The requests it holds (queued, running, parked, or still to be added): the old
    controller's, whose clients went with it (a controller that adopts it aborts them)."""
    first_layer: int = 0
    end_layer: int = 0
    """A stage's layers [first_layer, end_layer) (0, 0: an instance, or an older agent)."""
    next_node: int | None = None
    """The node a stage hands its output to (None: the last stage, or an instance)."""
    compute_group: str | None = None
    """A stage's `StageOpenOp.compute_group` (a live prefill's stage, BlitzScale §5.2)."""
    seq_ids: tuple[int, ...] = ()
    """The sequences whose K/V a stage holds: the old controller's head engines' (a
    controller that adopts its pipeline frees them along the chain)."""


@dataclass(frozen=True)
class StatusReply(Reply):
    node: int
    port: int
    models: dict[str, ModelHolding]
    bytes_in: int
    bytes_out: int
    peers: tuple[int, ...]
    running: tuple[RunningHolding, ...] = ()
    """Its local instances and pipeline stages (an older agent reports none)."""
    emulated_steps: int = 0
    """Engine steps paced by GPU-time emulation (0: not emulated)."""
    emulation_violations: int = 0
    """Of those, steps whose real work overran their paced time (`surge.emulation`)."""
    emulation_overrun_s: float = 0.0
    """Real seconds the violating steps ran past their paced time, summed."""


@dataclass(frozen=True)
class RegisterReply(Reply):
    model: str
    num_blocks: int


@dataclass(frozen=True)
class LinkReport(Reply):
    """A node's links as configured (its hello to the controller; `policy.multicast.topology`'s
    `NodeLinks`): NIC caps (None: uncapped) and the machine it shares with other agents."""

    egress_gbps: float | None = None
    ingress_gbps: float | None = None
    host_group: str | None = None
    host_gbps: float | None = None
    shares_device: bool = False
    """Its host mates can open its device memory (CUDA IPC, the fake GPU; not the CPU)."""

    @staticmethod
    def planned(report: "LinkReport | None") -> NodeLinks:
        """The links as the multicast planner takes them (`policy.multicast.topology`); an
        agent that reports none is planned as uncapped and alone."""
        if report is None:
            return NodeLinks()
        return NodeLinks(
            report.egress_gbps,
            report.ingress_gbps,
            report.host_group,
            report.host_gbps,
            report.shares_device,
        )


@dataclass(frozen=True)
class SetPeersReply(Reply):
    peers: tuple[int, ...]
    links: LinkReport | None = None
    """This node's links (None: an agent that does not report them)."""


@dataclass(frozen=True)
class LoadReply(Reply):
    seconds: float
    """Until every block was usable in its tier."""
    fetch_seconds: float
    """Until every block was read (the engine may still have been taking them in)."""


@dataclass(frozen=True)
class DropReply(Reply):
    """What `drop_model` ended on a node."""

    aborted_ops: int
    """Ops about the model that were still running and were aborted (loads, pulls, ...)."""
    closed: int
    """Instances and pipeline stages of the model that were closed."""


@dataclass(frozen=True)
class ChecksumsReply(Reply):
    checksums: dict[int, str]
    """Checksum ("crc32:<hex>", as in the manifest) of each block held in host or gpu memory."""


@dataclass(frozen=True)
class GenerateReply(Reply):
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class BlockReply(Reply):
    """Header of a block send; the block's bytes are the frame payload."""

    model: str
    block: int


@dataclass(frozen=True)
class MulticastReply(Reply):
    mc_id: str
    num_recv: int


@dataclass(frozen=True)
class PipelineReply(Reply):
    pipeline: str


@dataclass(frozen=True)
class StageStepReply(Reply):
    """The tokens the last stage picked (`StageStepOp.draws`); no payload."""

    sampled: Sampled = field(default_factory=Sampled)
    spans: tuple[tuple[int, float, float], ...] = ()
    """(node, start, end) of each stage's compute for this step, in stage order (wall
    clock, seconds since the epoch): who worked on which batch when (BlitzScale's
    cross-batch overlap, Fig. 12b, is read from these)."""


@dataclass(frozen=True)
class InstanceReply(Reply):
    instance: str


@dataclass(frozen=True)
class SubmitReply(Reply):
    queued: bool = True


@dataclass(frozen=True)
class AdoptReply(Reply):
    seq_id: int


@dataclass(frozen=True)
class AbortReply(Reply):
    outputs: dict[str, tuple[int, ...]]
    """req_id -> tokens generated so far, of each request taken out."""


@dataclass(frozen=True)
class QueuedReply(Reply):
    req_ids: tuple[str, ...]
    """Requests queued on the instance that have not started (`instance_queued`), or
    those of them taken back (`instance_take_queued`), in the order it would start them."""


@dataclass(frozen=True)
class KvPart(Reply):
    """K/V of one sequence at one stage: the reply of `kv_export` (bytes in the payload)
    and one entry of `instance_adopt.parts` (bytes concatenated in the payload)."""

    first_layer: int
    end_layer: int
    shape: tuple[int, ...]
    digest: str = ""
    """The version of the weights that computed it (`Manifest.digest`): a receiver of
    another version refuses it (`policy.versions.refuse_kv`); "" (not said) is refused."""

    def __post_init__(self) -> None:
        require(0 <= self.first_layer < self.end_layer, "KvPart", "needs first < end layer")


@dataclass(frozen=True)
class KvPushReply(Reply):
    """What a `kv_push` sent: K/V bytes over the transport (a target on the sending node
    itself is written in place and counts nothing)."""

    num_bytes: int


@dataclass(frozen=True)
class LayerTimesReply(Reply):
    """The reply of `stage_profile`: measured seconds of each layer of a stage (FlexPipe §5's
    t_c), at a prefill of `num_tokens` tokens and at a one-token decode step, and the bytes
    one token's hidden state takes between stages (s_a per token)."""

    first_layer: int
    prefill_s: tuple[float, ...]
    decode_s: tuple[float, ...]
    activation_bytes_per_token: int


@dataclass(frozen=True)
class HandoffReply(Reply):
    """A parked prefill's K/V (every layer; bytes in the payload) and the tokens it
    generated, taken off a prefill instance for its decode instance (P/D, BlitzScale §6)."""

    part: KvPart
    output_token_ids: tuple[int, ...]
    num_cached: int
