"""The CPU body of the device seam: the device's memory is host memory.

A block received into a buffer the gpu tier owns is adopted (its tensors view that buffer:
no copy, as before the seam); a borrowed buffer (the host tier's shared memory, on a warm
start) is copied once into an arena, synchronously. Nothing is pinned; nothing is shared
between processes (`can_share` is False: the store copies instead).
"""

import torch

from surge.engine.devmem.base import DONE, CopyEvent, DeviceCopy, IpcHandle, host_bytes
from surge.errors import SurgeError


class CpuMemory:
    """`DeviceMemory` for the CPU."""

    shares_host_memory = True
    can_share = False

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    def register_host(self, buf: memoryview) -> None:
        return None

    def unregister_host(self, buf: memoryview) -> None:
        return None

    def host_buffer(self, num_bytes: int) -> memoryview:
        return memoryview(bytearray(num_bytes))

    def arena(self, num_bytes: int) -> torch.Tensor:
        return torch.empty(num_bytes, dtype=torch.uint8)

    def copy_in(self, buf: memoryview, arena: torch.Tensor) -> CopyEvent:
        if len(buf):
            arena.copy_(host_bytes(memoryview(buf).cast("B")))
        return DONE

    def export_ipc(self, data: torch.Tensor) -> IpcHandle:
        raise SurgeError("the cpu device cannot share its memory with other processes")

    def open_ipc(self, handle: IpcHandle) -> DeviceCopy:
        raise SurgeError("the cpu device cannot open another process's device memory")

    def close(self) -> None:
        return None
