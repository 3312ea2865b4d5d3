"""The CUDA body of the device seam (torch.cuda only; no other binding).

- Pinning: host memory the gpu tier copies from — the host tier's shared-memory segments —
  is page-locked once with cudaHostRegister (portable flag: pinned for every device of the
  process) through torch's cudart binding, so a copy from it runs at the link's speed
  instead of through the driver's pageable staging buffer.
- Copies: one `copy_(non_blocking=True)` per block on a dedicated copy stream, so a copy
  overlaps the engine's compute on the default stream and the next block's receive; one
  CUDA event recorded after it is the block's arrival (ServerlessLLM §4, fastsafetensors).
- IPC: an arena's allocation is exported with `UntypedStorage._share_cuda_` and opened
  with `UntypedStorage._new_shared_cuda` (what torch.multiprocessing does, without its
  pickling: the fields travel as JSON). Opened on the device that made it, the tensor is the
  very memory (no copy); on another device of the machine, one device-to-device copy on the
  copy stream (NVLink where the GPUs have it).
Not yet run on a GPU in this project (no device was lent; docs/gpu.md): the fake device
(`fake.py`) stands in for it in the tests.
"""

import threading

import torch

from surge.engine.devmem.base import DeviceCopy, IpcHandle, address_of, host_bytes
from surge.errors import SurgeError

HOST_REGISTER_PORTABLE = 1
"""cudaHostRegisterPortable: the pinned range counts as pinned for every CUDA context."""


class CudaEvent:
    """`CopyEvent` over a torch.cuda.Event; keeps the copy's host source alive until done."""

    def __init__(self, event: torch.cuda.Event, source: torch.Tensor | None) -> None:
        self._event = event
        self._source = source

    def query(self) -> bool:
        done = self._event.query()
        if done:
            self._source = None
        return done

    def wait(self) -> None:
        self._event.synchronize()  # releases the GIL while it waits
        self._source = None


class CudaMemory:
    """`DeviceMemory` of one CUDA device in this process."""

    shares_host_memory = False
    can_share = True

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise SurgeError(f"CudaMemory needs a cuda device, not {device}")
        self.device = torch.device("cuda", device.index or 0)
        self.stream = torch.cuda.Stream(self.device)
        """The copy stream: host -> device copies, never the engine's compute."""
        self._pinned: dict[int, int] = {}
        """Address -> bytes of every range this process registered."""
        self._lock = threading.Lock()

    def register_host(self, buf: memoryview) -> None:
        addr, n = address_of(buf)
        with self._lock:
            if not n or addr in self._pinned:
                return
            rt = torch.cuda.cudart()
            err = rt.cudaHostRegister(addr, n, HOST_REGISTER_PORTABLE)
            if err != rt.cudaError.success:
                raise SurgeError(f"cudaHostRegister of {n} bytes failed: {err}")
            self._pinned[addr] = n

    def unregister_host(self, buf: memoryview) -> None:
        addr, _ = address_of(buf)
        with self._lock:
            if self._pinned.pop(addr, None) is None:
                return
            self.stream.synchronize()  # no copy may still read the range
            torch.cuda.cudart().cudaHostUnregister(addr)

    def host_buffer(self, num_bytes: int) -> memoryview:
        pinned = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
        return memoryview(pinned.numpy())  # the array keeps the pinned tensor alive

    def arena(self, num_bytes: int) -> torch.Tensor:
        return torch.empty(num_bytes, dtype=torch.uint8, device=self.device)

    def copy_in(self, buf: memoryview, arena: torch.Tensor) -> CudaEvent:
        view = memoryview(buf).cast("B")
        src = host_bytes(view) if len(view) else None
        return self._copy(src, arena)

    def export_ipc(self, data: torch.Tensor) -> IpcHandle:
        if data.storage_offset() or data.untyped_storage().nbytes() != data.numel():
            raise SurgeError("only a whole arena (`arena`) can be shared, not a slice")
        fields = data.untyped_storage()._share_cuda_()
        device, handle, _size_bytes, offset_bytes, rc_handle, rc_offset, ev_handle, sync = fields
        return IpcHandle(
            kind="cuda",
            device_index=int(device),
            num_bytes=data.numel(),
            handle_hex=bytes(handle).hex(),
            offset_bytes=int(offset_bytes),
            ref_counter_hex=bytes(rc_handle).hex(),
            ref_counter_offset=int(rc_offset),
            event_hex=bytes(ev_handle).hex() if ev_handle else "",
            event_sync_required=bool(sync),
        )

    def open_ipc(self, handle: IpcHandle) -> DeviceCopy:
        if handle.kind != "cuda":
            raise SurgeError(f"a cuda device cannot open a {handle.kind} IPC handle")
        storage = torch.UntypedStorage._new_shared_cuda(
            handle.device_index,
            bytes.fromhex(handle.handle_hex),
            handle.num_bytes,
            handle.offset_bytes,
            bytes.fromhex(handle.ref_counter_hex),
            handle.ref_counter_offset,
            bytes.fromhex(handle.event_hex) if handle.event_hex else None,
            handle.event_sync_required,
        )
        owner = torch.device("cuda", handle.device_index)
        shared = torch.empty(0, dtype=torch.uint8, device=owner)
        shared.set_(storage, 0, (handle.num_bytes,), (1,))
        if owner == self.device:
            return DeviceCopy(shared, CudaEvent(_recorded(self.stream), None))
        arena = self.arena(handle.num_bytes)  # another GPU: one peer copy (NVLink)
        return DeviceCopy(arena, self._copy(shared, arena))

    def close(self) -> None:
        with self._lock:
            if self._pinned:
                self.stream.synchronize()
            for addr in self._pinned:
                torch.cuda.cudart().cudaHostUnregister(addr)
            self._pinned.clear()

    def _copy(self, src: torch.Tensor | None, arena: torch.Tensor) -> CudaEvent:
        """One copy on the copy stream, after what the engine's stream issued so far (the
        arena's allocation is ordered on it), and the event recorded after it."""
        engine_stream = torch.cuda.current_stream(self.device)  # before switching streams
        with torch.cuda.stream(self.stream):
            self.stream.wait_stream(engine_stream)
            if src is not None:
                arena.copy_(src, non_blocking=True)
            # The arena lives as long as its block: never freed while the copy runs.
            return CudaEvent(_recorded(self.stream), src)


def _recorded(stream: torch.cuda.Stream) -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record(stream)
    return event
