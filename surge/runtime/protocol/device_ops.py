"""The agent ops that share one device copy among the agents of a host group.

What flows: `open_mate_copy` (controller -> an agent: take these blocks' device copy from a
host mate instead of copying them), which makes that agent send `export_device` to the mate
(agent -> agent: the IPC handles of the blocks' arenas, `surge.engine.ipc_handle`, JSON in
the reply). Same conventions as `protocol/ops.py`; import from `protocol`. Owned by the
runtime (docs/runtime.md, Protocol; docs/gpu.md).
"""

from dataclasses import dataclass

from surge.engine.ipc_handle import IpcHandle
from surge.json_codec import require
from surge.runtime.protocol.ops import Op
from surge.runtime.protocol.replies import LoadReply, Reply


@dataclass(frozen=True)
class DeviceHandlesReply(Reply):
    """One IPC handle per asked block, in the order asked."""

    handles: tuple[IpcHandle, ...]


@dataclass(frozen=True)
class ExportDeviceOp(Op[DeviceHandlesReply], name="export_device", reply=DeviceHandlesReply):
    """A host mate asks for the IPC handles of blocks this agent holds on its device."""

    model: str
    blocks: tuple[int, ...]
    digest: str = ""
    """The version the mate holds the model at (`Manifest.digest`): an agent holding
    another version shares nothing ("": any)."""

    def __post_init__(self) -> None:
        require(bool(self.blocks), "op export_device", "needs blocks")


@dataclass(frozen=True)
class OpenMateCopyOp(Op[LoadReply], name="open_mate_copy", reply=LoadReply):
    """Put `blocks` into this agent's gpu tier by opening host mate `mate`'s device copy
    (CUDA IPC): no copy on the same GPU, one device-to-device copy from another GPU of the
    machine. Each block is announced (`arrival`, tier gpu, source `mate`, `src` = mate)."""

    model: str
    blocks: tuple[int, ...]
    mate: int

    def __post_init__(self) -> None:
        require(bool(self.blocks), "op open_mate_copy", "needs blocks")
        require(self.mate >= 0, "op open_mate_copy", "needs a mate node id >= 0")
