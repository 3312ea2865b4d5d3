"""The agent protocol: every op, reply and event that crosses an agent socket, typed.

What flows: ops (controller or peer -> agent), replies (agent -> sender), events (agent ->
subscribers). Each is a frozen dataclass, validated at construction (a bad value raises
`SurgeError`), with `to_json()` / `from_json(d)`; its JSON is the frame header (payload
bytes, where an op has them, travel beside it). Defaults live in the dataclasses only.
The definitions are in this package: `ops.py` (K/V movement: `kv_ops.py`; a host group's
shared device copy: `device_ops.py`; a gloo group broadcast's op and event: `group_ops.py`),
`replies.py`, `events.py`, on the typed JSON codec `surge/json_codec.py`. Callers outside
the package import from here, never from a submodule.

Usage (controller side, `ClusterClient`):

    from surge.runtime.protocol import LoadOp, BlockArrived, AgentDown
    reply = await client.call(node, LoadOp(model="m", blocks=(0, 1), tier="gpu"))
    reply.seconds                                       # a LoadReply
    replies = await client.broadcast(StatusOp())        # {node: StatusReply}
    reply, body = await client.call_bytes(node, KvExportOp(...))   # replies with bytes
    q = client.subscribe((BlockArrived, AgentDown), model="m")    # only these, this model
    ev = await q.get()                                  # a BlockArrived or an AgentDown
    client.unsubscribe(q)

Agent side: `Op.decode(header)` gives the op (or a SurgeError for an unknown op or a bad
field, sent back as `{"ok": false, "error": ...}`); the agent looks the handler up by the
op's class. Owned by the runtime; docs/runtime.md (Protocol) has the table.
"""

from surge.runtime.protocol.device_ops import DeviceHandlesReply, ExportDeviceOp, OpenMateCopyOp
from surge.runtime.protocol.events import (
    EVENTS,
    AgentDown,
    BlockArrived,
    BlockCorrupt,
    Event,
    PullFailed,
    ReceiveDone,
    RequestFailed,
    TokenGenerated,
)
from surge.runtime.protocol.group_ops import (
    GROUP_INIT_TIMEOUT_S,
    GroupAlgorithm,
    GroupBroadcastOp,
    GroupDone,
    GroupReply,
)
from surge.runtime.protocol.kv_ops import (
    InstanceAdoptOp,
    KvExportOp,
    KvImportOp,
    KvPushOp,
    KvSource,
    KvTarget,
    StageKvCopyOp,
)
from surge.runtime.protocol.ops import (
    HANDOFF_REASON,
    MULTICAST_WAIT_S,
    NO_STEP,
    OPS,
    ChecksumsOp,
    DropModelOp,
    EvictOp,
    GenerateOp,
    GetBlockOp,
    InstanceAbortOp,
    InstanceCloseOp,
    InstanceHandoffOp,
    InstanceOpenOp,
    InstanceRoleOp,
    InstanceSubmitOp,
    LandingTier,
    LoadOp,
    MulticastOp,
    Op,
    PullFromOp,
    RegisterOp,
    SetPeersOp,
    ShutdownOp,
    Source,
    StageCloseOp,
    StageFreeOp,
    StageOpenOp,
    StageProfileOp,
    StageStepOp,
    StatusOp,
    SubscribeOp,
    Tier,
)
from surge.runtime.protocol.replies import (
    AbortReply,
    Ack,
    AdoptReply,
    BlockReply,
    ChecksumsReply,
    DropReply,
    GenerateReply,
    HandoffReply,
    InstanceReply,
    KvPart,
    KvPushReply,
    LayerTimesReply,
    LinkReport,
    LoadReply,
    ModelHolding,
    MulticastReply,
    PipelineReply,
    RegisterReply,
    Reply,
    SetPeersReply,
    StageStepReply,
    StatusReply,
    SubmitReply,
    error_header,
    ok_header,
)

__all__ = [
    "EVENTS",
    "GROUP_INIT_TIMEOUT_S",
    "HANDOFF_REASON",
    "MULTICAST_WAIT_S",
    "NO_STEP",
    "OPS",
    "AbortReply",
    "Ack",
    "AdoptReply",
    "AgentDown",
    "BlockArrived",
    "BlockCorrupt",
    "BlockReply",
    "ChecksumsOp",
    "ChecksumsReply",
    "DeviceHandlesReply",
    "DropModelOp",
    "DropReply",
    "Event",
    "EvictOp",
    "ExportDeviceOp",
    "GenerateOp",
    "GenerateReply",
    "GetBlockOp",
    "GroupAlgorithm",
    "GroupBroadcastOp",
    "GroupDone",
    "GroupReply",
    "HandoffReply",
    "InstanceAbortOp",
    "InstanceAdoptOp",
    "InstanceCloseOp",
    "InstanceHandoffOp",
    "InstanceOpenOp",
    "InstanceReply",
    "InstanceRoleOp",
    "InstanceSubmitOp",
    "KvExportOp",
    "KvImportOp",
    "KvPart",
    "KvPushOp",
    "KvPushReply",
    "KvSource",
    "KvTarget",
    "LandingTier",
    "LayerTimesReply",
    "LinkReport",
    "LoadOp",
    "LoadReply",
    "ModelHolding",
    "MulticastOp",
    "MulticastReply",
    "Op",
    "OpenMateCopyOp",
    "PipelineReply",
    "PullFailed",
    "PullFromOp",
    "ReceiveDone",
    "RegisterOp",
    "RegisterReply",
    "Reply",
    "RequestFailed",
    "SetPeersOp",
    "SetPeersReply",
    "ShutdownOp",
    "Source",
    "StageCloseOp",
    "StageFreeOp",
    "StageKvCopyOp",
    "StageOpenOp",
    "StageProfileOp",
    "StageStepOp",
    "StageStepReply",
    "StatusOp",
    "StatusReply",
    "SubmitReply",
    "SubscribeOp",
    "Tier",
    "TokenGenerated",
    "error_header",
    "ok_header",
]
