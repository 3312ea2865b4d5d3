"""The device seam: how block bytes reach device memory.

What flows: host buffers (a block received or held in the host tier) in; device bytes (one
uint8 tensor per block, its "arena") and the event that says they arrived out; IPC handles
(frozen dataclasses, JSON on the wire) between the agents of one host group. Three bodies of
one interface (`base.DeviceMemory`), chosen by the engine's device setting (`select.py`):
`cuda.py` (pinned host memory, a copy stream, CUDA events and IPC), `cpu.py` (the device's
memory is host memory: a received block is adopted, no copy) and `fake.py` (a CPU stand-in
for a GPU whose copies and events are recorded and whose completion a test controls).
Owned by the engine; the node's store (`runtime/node/store.py`) drives it for the gpu tier.
Callers import from here.
"""

from surge.engine.devmem.base import (
    DONE,
    CopyEvent,
    DeviceCopy,
    DeviceMemory,
    IpcHandle,
    move_block,
)
from surge.engine.devmem.select import device_memory, shares_device

__all__ = [
    "DONE",
    "CopyEvent",
    "DeviceCopy",
    "DeviceMemory",
    "IpcHandle",
    "device_memory",
    "move_block",
    "shares_device",
]
