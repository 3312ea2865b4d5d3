"""The agent ops that move a running sequence's K/V cache between nodes.

What flows: `kv_export` (a stage's K/V of one sequence, bytes in the reply), `kv_import`
(write K/V into a stage), `kv_push` (a stage sends its K/V straight to the new holders,
FlexPipe §6 refactoring), `stage_kv_copy` (inside one node), and `instance_adopt` (a full
instance continues a request with its K/V, ParaServe §6 consolidation, BlitzScale P/D and
live-scaling hand-offs), which names the K/V by `parts` in its payload or by `sources` the
adopting agent pulls itself. Same conventions as `protocol/ops.py` (frozen, validated at
construction, JSON header + raw payload bytes); import from `protocol.py`. Owned by the
runtime (docs/runtime.md, Protocol).
"""

from dataclasses import dataclass, field

from surge.engine.sampling import SamplingParams
from surge.json_codec import Message, require
from surge.runtime.protocol.ops import Op
from surge.runtime.protocol.replies import Ack, AdoptReply, KvPart, KvPushReply


@dataclass(frozen=True)
class KvSource(Message):
    """Where one part of a sequence's K/V is: the stage of `pipeline` on `node`, sequence
    `seq_id`, its first `num_tokens` tokens (one `kv_export` there)."""

    node: int
    pipeline: str
    seq_id: int
    num_tokens: int

    def __post_init__(self) -> None:
        require(self.node >= 0 and self.num_tokens >= 1, "KvSource", "needs a node and tokens")


@dataclass(frozen=True)
class InstanceAdoptOp(Op[AdoptReply], name="instance_adopt", reply=AdoptReply):
    """Continue a request with its K/V (KV migration, ParaServe §6): either `parts`, their
    bytes concatenated in the payload, or `sources`, which this agent pulls from the stages
    that hold them (`kv_export` to each source's node, agent to agent), in layer order."""

    instance: str
    req_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    num_cached: int
    parts: tuple[KvPart, ...] = ()
    params: SamplingParams = field(default_factory=SamplingParams)
    sources: tuple[KvSource, ...] = ()

    def __post_init__(self) -> None:
        require(
            bool(self.parts) != bool(self.sources),
            "op instance_adopt",
            "needs K/V parts (bytes in the payload) or sources, not both",
        )


@dataclass(frozen=True)
class KvExportOp(Op[KvPart], name="kv_export", reply=KvPart):
    """K/V of one sequence's first `num_tokens` tokens at this stage (for migration)."""

    pipeline: str
    seq_id: int
    num_tokens: int


@dataclass(frozen=True)
class KvImportOp(Op[Ack], name="kv_import"):
    """Write one sequence's migrated K/V into this node's stage of `pipeline`: `parts`
    (layers within the stage, bytes concatenated in the payload) for its first tokens
    (FlexPipe §6 refactoring: only valid tokens travel, Eq. 10)."""

    pipeline: str
    seq_id: int
    parts: tuple[KvPart, ...]
    first_token: int = 0
    """The parts hold tokens [first_token, first_token + n): a top-up of an earlier copy
    (FlexPipe §6.3: K/V moves while the old pipeline serves; the pause sends the rest)."""


@dataclass(frozen=True)
class KvTarget(Message):
    """One destination of a `kv_push`: layers [first_layer, end_layer) go to `node`."""

    node: int
    first_layer: int
    end_layer: int

    def __post_init__(self) -> None:
        require(0 <= self.first_layer < self.end_layer, "KvTarget", "needs first < end layer")


@dataclass(frozen=True)
class KvPushOp(Op[KvPushReply], name="kv_push", reply=KvPushReply):
    """Send one sequence's K/V at this node's stage of `pipeline` (its first `num_tokens`
    tokens) straight to the nodes that take its layers in stage `new_pipeline`: one
    `kv_import` per target, agent to agent (FlexPipe §6 refactoring, Eq. 10: only valid
    tokens travel, and not through the controller)."""

    pipeline: str
    new_pipeline: str
    seq_id: int
    num_tokens: int
    targets: tuple[KvTarget, ...]
    first_token: int = 0
    """Send tokens [first_token, num_tokens) only (the rest went earlier)."""

    def __post_init__(self) -> None:
        require(
            self.num_tokens >= 1 and bool(self.targets), "op kv_push", "needs tokens and targets"
        )
        require(
            0 <= self.first_token < self.num_tokens, "op kv_push", "needs first_token < num_tokens"
        )


@dataclass(frozen=True)
class StageKvCopyOp(Op[Ack], name="stage_kv_copy"):
    """Copy, inside this node, the K/V of the layers stage `source` and stage `pipeline`
    share, for each (seq_id, num_tokens) (FlexPipe refactoring: layers that stay put)."""

    pipeline: str
    source: str
    seqs: tuple[tuple[int, int], ...]
    first_tokens: tuple[int, ...] = ()
    """Per entry of `seqs`: copy tokens from this one on (empty: all from 0)."""
