"""The interface every device body implements, and the one way a block moves through it.

A block moves host -> device as ONE contiguous copy into its own arena (a uint8 tensor of the
block's size on the device), issued on the device's copy stream, with one event recorded
after it (the anchors: ServerlessLLM's loader, Run:ai's streamer, fastsafetensors — large
contiguous copies from pinned memory, overlapped with the next read). The block's tensors
are views into the arena (`surge.model.blocks.tensors_in`), usable once the event completed.
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from surge.engine.ipc_handle import IpcHandle
from surge.errors import SurgeError


class CopyEvent(Protocol):
    """Completion of one copy (a CUDA event recorded on the copy stream after it)."""

    def query(self) -> bool:
        """Whether the copy has completed (never blocks)."""
        ...

    def wait(self) -> None:
        """Block the calling thread until the copy has completed."""
        ...


class Done:
    """The event of a copy that completed when it was issued (CPU), or of no copy at all."""

    def query(self) -> bool:
        return True

    def wait(self) -> None:
        return None


DONE = Done()


@dataclass(frozen=True)
class DeviceCopy:
    """One block's bytes on the device: usable once `event` completed."""

    data: torch.Tensor
    """uint8 [size_bytes] on the device (the block's arena, or an opened IPC mapping)."""
    event: CopyEvent


class DeviceMemory(Protocol):
    """One process's view of one device: pinning, arenas, the copy stream, IPC."""

    device: torch.device
    """Where the engine's tensors live (the fake device computes on the CPU)."""
    shares_host_memory: bool
    """The device's memory is host memory (CPU): a buffer the caller owns is adopted as
    the block's bytes, no copy."""
    can_share: bool
    """Arenas can be exported to other processes (`export_ipc`)."""

    def register_host(self, buf: memoryview) -> None:
        """Pin host memory for fast copies (CUDA: cudaHostRegister, portable), once per
        buffer; a no-op where there is nothing to pin."""
        ...

    def unregister_host(self, buf: memoryview) -> None:
        """Undo `register_host`, after every copy that reads the buffer has completed."""
        ...

    def host_buffer(self, num_bytes: int) -> memoryview:
        """A writable host buffer a block can be received into and copied from at the
        link's speed (pinned on CUDA)."""
        ...

    def arena(self, num_bytes: int) -> torch.Tensor:
        """A uint8 [num_bytes] tensor of device memory (one block's)."""
        ...

    def copy_in(self, buf: memoryview, arena: torch.Tensor) -> CopyEvent:
        """Issue one contiguous copy of `buf` into `arena` on the copy stream; returns its
        event. `buf` must stay alive and unchanged until the event completed."""
        ...

    def export_ipc(self, data: torch.Tensor) -> IpcHandle:
        """A handle another process of this machine can open to map `data` (an arena)."""
        ...

    def open_ipc(self, handle: IpcHandle) -> DeviceCopy:
        """The bytes behind a handle, on this process's device: the very allocation when it
        is on this device (no copy), else one device-to-device copy (NVLink) into an arena."""
        ...

    def close(self) -> None:
        """Release what this process holds (pins, the fake device's files)."""
        ...


def move_block(memory: DeviceMemory, buf: memoryview, adopt: bool) -> DeviceCopy:
    """A block's bytes onto the device: one copy on the copy stream with one event, or, where
    the device's memory is host memory and the caller hands the buffer over (`adopt`), the
    buffer itself (no copy)."""
    view = memoryview(buf).cast("B")
    if adopt and memory.shares_host_memory:
        return DeviceCopy(host_bytes(view), DONE)
    arena = memory.arena(len(view))
    return DeviceCopy(arena, memory.copy_in(view, arena))


def host_bytes(view: memoryview) -> torch.Tensor:
    """A uint8 tensor viewing a host buffer (no copy; the buffer must be writable)."""
    if view.readonly:
        raise SurgeError("a block's host buffer is read-only; receive into a writable buffer")
    if len(view) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(view, dtype=torch.uint8)


def address_of(buf: memoryview) -> tuple[int, int]:
    """(address, bytes) of a host buffer ((0, 0) when empty)."""
    view = memoryview(buf).cast("B")
    if not len(view):
        return 0, 0
    return host_bytes(view).data_ptr(), len(view)
