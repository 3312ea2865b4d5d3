"""What a node holds of one model: its manifest, which blocks are present (peers may pull
them), the gpu tier's buffers and device bytes, and the engine's runner over them.

Plain state, filled by the store (`runtime/node/store.py`) and the device tier
(`runtime/node/device_tier.py`), read by the agent's instances and serving paths. Owned by
the node agent.
"""

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from surge.errors import SurgeError
from surge.model.manifest import BlockInfo, Manifest


@dataclass
class ModelState:
    """What this node holds of one model."""

    manifest: Manifest
    charges: tuple[float, ...] = ()
    """Under GPU-time emulation, per block: what each of its bytes costs on a paced link or
    tier (`surge.emulation.block_charges`: every block moves in one emulated block's time);
    empty: every byte costs one."""
    present: dict[int, asyncio.Event] = field(default_factory=dict)
    """Per block: set while a verified copy is held (peers may pull it)."""
    gpu_buffers: dict[int, Any] = field(default_factory=dict)
    """Per gpu-tier block: the host buffer it landed in (peers are served from it)."""
    device_blocks: dict[int, Any] = field(default_factory=dict)
    """Per block whose copy to the device completed: its bytes there (a uint8 tensor); the
    gpu tier as reported and as runners see it."""
    runner: Any = None
    """The engine's runner over the gpu-tier blocks (created on the first one)."""
    runner_lock: threading.Lock = field(default_factory=threading.Lock)
    """Blocks are taken into the runner in worker threads, several at once when they land
    together: the first creates it, under this lock, or two would each create one and the
    blocks added to the lost one would be missing from the runner."""
    dropped: threading.Event = field(default_factory=threading.Event)
    """Set when the model is dropped from the node (`drop_model`): its reads in worker
    threads stop at their next chunk."""

    def event(self, block: int) -> asyncio.Event:
        return self.present.setdefault(block, asyncio.Event())

    def block(self, block: int) -> BlockInfo:
        if not 0 <= block < self.manifest.num_blocks:
            raise SurgeError(
                f"block {block} is out of range: the model has {self.manifest.num_blocks} blocks"
            )
        return self.manifest.blocks[block]

    def charge(self, block: int) -> float:
        """What each byte of `block` costs on a paced link or tier (`charges`)."""
        return self.charges[block] if self.charges else 1.0

    @property
    def complete_in_gpu(self) -> bool:
        return self.runner is not None and len(self.device_blocks) == self.manifest.num_blocks
