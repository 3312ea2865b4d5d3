"""Host -> device copy rates through the device seam, by kind of host memory.

What flows: a `DeviceMemory` and a size in; GB/s out for pageable memory (a plain CPU
tensor), pinned memory (`host_buffer`: `pin_memory()` on CUDA) and POSIX shared memory
registered with the device (`register_host`: cudaHostRegister, what the host tier does).
Each is the best of `repeats` copies of the whole buffer, one contiguous copy on the copy
stream waited on by its event (the block path's own calls).
"""

import shutil
import time
from multiprocessing import shared_memory

import torch

from surge.engine.devmem import DeviceMemory
from surge.errors import SurgeError
from surge.runtime.node.tiers import SHM_DIR

MIB = 1 << 20


def copy_gbps(memory: DeviceMemory, src: memoryview, repeats: int) -> float:
    """Best rate of `repeats` copies of `src` into one arena."""
    arena = memory.arena(len(src))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        memory.copy_in(src, arena).wait()
        best = min(best, time.perf_counter() - t0)
    del arena
    return len(src) / best / 1e9


def link_rates(memory: DeviceMemory, num_bytes: int, repeats: int = 3) -> dict[str, float]:
    """GB/s from pageable, pinned and registered shared memory; the registration's cost."""
    out: dict[str, float] = {}
    pageable = torch.ones(num_bytes, dtype=torch.uint8)  # touched: every page is resident
    out["pageable_gbps"] = copy_gbps(memory, memoryview(pageable.numpy()), repeats)
    del pageable
    pinned = memory.host_buffer(num_bytes)
    torch.frombuffer(pinned, dtype=torch.uint8).fill_(1)
    out["pinned_gbps"] = copy_gbps(memory, pinned, repeats)
    del pinned
    free = shutil.disk_usage(SHM_DIR).free if SHM_DIR.is_dir() else num_bytes
    if free < num_bytes:  # a write past /dev/shm's room is a SIGBUS, not an error
        raise SurgeError(
            f"{SHM_DIR} has {free / MIB:.0f} MiB free; the test needs {num_bytes / MIB:.0f}"
        )
    seg = shared_memory.SharedMemory(create=True, size=num_bytes)
    try:
        torch.frombuffer(seg.buf, dtype=torch.uint8).fill_(1)
        t0 = time.perf_counter()
        memory.register_host(seg.buf)
        out["register_s"] = time.perf_counter() - t0
        out["registered_shm_gbps"] = copy_gbps(memory, seg.buf, repeats)
        memory.unregister_host(seg.buf)
    finally:
        seg.close()
        seg.unlink()
    out["registered_vs_pinned"] = out["registered_shm_gbps"] / out["pinned_gbps"]
    return out
