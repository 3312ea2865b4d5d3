"""Which body of the device seam a process uses: one per device, made once.

The engine's `device` setting picks it (`surge.engine.device.pick_device`): cuda -> `CudaMemory`
(its copy stream and its pinned ranges are per process and device, so every runner and the
store share one), cpu -> `CpuMemory`, `fake` -> an auto-completing `FakeMemory` (tests that
start agents as processes; a test in-process passes its own, gated one).
"""

import threading

import torch

from surge.engine.devmem.base import DeviceMemory
from surge.engine.devmem.cpu import CpuMemory
from surge.engine.devmem.fake import FakeMemory

_made: dict[str, DeviceMemory] = {}
_lock = threading.Lock()


def device_memory(setting: str = "auto") -> DeviceMemory:
    """The process's `DeviceMemory` for an engine device setting (auto, cpu, cuda[:N], fake)."""
    from surge.engine.device import pick_device

    key = "fake" if setting == "fake" else str(pick_device(setting))
    with _lock:
        memory = _made.get(key)
        if memory is None:
            memory = _made[key] = _make(key)
        return memory


def shares_device(setting: str = "auto") -> bool:
    """Whether the body `device_memory(setting)` makes can export its arenas to other
    processes (`DeviceMemory.can_share`: CUDA and the fake GPU, not the CPU), answered
    without making it (an agent reports it in its hello, before it touched the device)."""
    from surge.engine.device import pick_device

    return setting == "fake" or pick_device(setting).type == "cuda"


def _make(key: str) -> DeviceMemory:
    if key == "fake":
        return FakeMemory()
    device = torch.device(key)
    if device.type == "cuda":
        from surge.engine.devmem.cuda import CudaMemory

        return CudaMemory(device)
    return CpuMemory()
