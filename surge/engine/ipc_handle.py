"""The wire form of a device allocation shared between processes of one machine.

What flows: an agent holding a block's device copy exports one `IpcHandle` per block
(`surge.engine.devmem`); the handles travel as JSON (a reply of the agent protocol) to its
host mates, which open them instead of copying. Torch-free, so the protocol can carry it.
"""

from dataclasses import dataclass

from surge.errors import SurgeError
from surge.json_codec import Message


@dataclass(frozen=True)
class IpcHandle(Message):
    """A device allocation another process of the same machine can open (CUDA IPC: the
    fields of `torch.UntypedStorage._share_cuda_`; fake: a file in /dev/shm). Byte strings
    travel as hex."""

    kind: str
    """`cuda` or `fake`: the body that made it (and the only one that can open it)."""
    device_index: int
    num_bytes: int
    handle_hex: str
    """CUDA: the cudaIpcMemHandle of the allocation; fake: the hex of the file's path."""
    offset_bytes: int = 0
    """Where the arena starts in that allocation (CUDA's caching allocator sub-allocates)."""
    ref_counter_hex: str = ""
    ref_counter_offset: int = 0
    event_hex: str = ""
    event_sync_required: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("cuda", "fake"):
            raise SurgeError(f"IPC handle of unknown kind {self.kind!r} (cuda or fake)")
        if self.num_bytes < 0 or self.offset_bytes < 0 or self.device_index < 0:
            raise SurgeError("IPC handle sizes, offsets and device index must be >= 0")
