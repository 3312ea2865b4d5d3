"""`BlockWeights`: the weights one runner holds, from block bytes to the layers a step runs.

What flows in: blocks, one at a time as they arrive (a buffer read from disk or received from
a peer, or bytes the node's store already moved to the device). Each block's bytes reach the
device through the device seam (`surge.engine.devmem.move_block`: one contiguous copy with one
event, or on the CPU the buffer itself), and only once they arrived are they cut into
`LayerWeights`, the embedding and the head (views of the block's bytes, `tensors_in`; cast
copies where the store's dtype is not the one the steps compute in). Out:
those weights, which `ModelRunner`'s step path reads, and the gradual work on them: an older
store's q/k/v and gate/up fused (`fuse_some`), CPU projections packed for oneDNN
(`pack_some`), a little per step so that no step stalls on it. Owned by the runner
(`surge.engine.runner`); knows nothing of steps, the KV cache or compiled graphs.
"""

import logging
import threading
from collections import deque
from dataclasses import replace

import torch

from surge.config import EngineConfig
from surge.engine.devmem import DeviceMemory, move_block
from surge.engine.linear import can_pack
from surge.engine.model import HeadWeights, LayerWeights, embedding_of
from surge.model.blocks import read_block_file, tensors_in
from surge.model.manifest import Manifest, verify_block

log = logging.getLogger(__name__)


class BlockWeights:
    """Blocks of one model on the device, as the layers, embedding and head they hold."""

    def __init__(
        self,
        manifest: Manifest,
        config: EngineConfig,
        device: torch.device,
        memory: DeviceMemory,
        dtype: torch.dtype,
    ) -> None:
        self.manifest, self.arch, self.config = manifest, manifest.arch, config
        self.dtype = dtype
        """The dtype the steps compute in (`engine.device.compute_dtype`): weights stored
        in another are cast as their block is taken in."""
        self.memory = memory
        """How block bytes reach the device (`surge.engine.devmem`; a test passes a fake)."""
        self.block_buffers: dict[int, bytearray | memoryview] = {}
        """Block index -> the host buffer `add_block` took it from (on the CPU the weights
        are views into it)."""
        self.block_data: dict[int, torch.Tensor] = {}
        """Block index -> its bytes on the device (uint8; the weights are views into it)."""
        self.layers: dict[int, LayerWeights] = {}
        self.embedding: torch.Tensor | None = None
        self.head: HeadWeights | None = None
        self.packs = (
            config.pack_cpu_weights
            and self.arch.hidden_size >= config.pack_min_hidden_size
            and device.type == "cpu"
            and can_pack(torch.empty(1, 1, dtype=dtype))
        )
        """Whether projections get packed copies (gradually, `pack_some`)."""
        self.pack_queue: deque[tuple[int | None, str]] = deque()
        """Projections still unpacked: (layer, field), or (None, "lm_head") for the head."""
        self.num_packed = 0
        """Projections packed so far (with `pack_queue`: whether packing is under way)."""
        self.fuse_queue: deque[int] = deque()
        """Layers of an older store (separate q/k/v, gate/up) still to fuse
        (`EngineConfig.fuse_projections`); stays empty for a version-3 store."""
        self.lock = threading.Lock()
        """Held while fusing or packing (the steps' gradual work, or the compile thread's
        `settle`): never both at once."""

    # ---- blocks in -------------------------------------------------------------------

    def add_block(self, index: int, buf: bytearray | memoryview, verify: bool = True) -> None:
        """Make block `index` usable from `buf`: its bytes move to the device
        (`devmem.move_block`: one copy, or on the CPU the buffer itself), and the block is
        taken in once they arrived."""
        if verify:
            verify_block(self.manifest.blocks[index], memoryview(buf).cast("B"))
        copy = move_block(self.memory, buf, adopt=True)
        copy.event.wait()
        self.block_buffers[index] = buf
        self.install_block(index, copy.data)

    def install_block(self, index: int, data: torch.Tensor) -> None:
        """Take in block `index` from its bytes on the device (uint8, already arrived: the
        node's store waits for the copy's event, `runtime/node/store.py`); no copy."""
        info = self.manifest.blocks[index]
        tensors = tensors_in(info, data)
        cast = {n for n, t in tensors.items() if t.is_floating_point() and t.dtype != self.dtype}
        if cast:  # e.g. a float32 store on CUDA: one copy each (strides kept), not views
            tensors |= {n: tensors[n].to(self.dtype) for n in cast}
        self.block_data[index] = data
        fuse = self.config.fuse_projections
        for layer in range(info.first_layer, info.end_layer):
            weights = LayerWeights.from_tensors(tensors, layer, self.arch, fuse)
            self.layers[layer] = weights
            if fuse and not weights.is_fused:  # an older store: fused by `fuse_some`, then packed
                self.fuse_queue.append(layer)
            elif self.packs:
                self.pack_queue.extend((layer, name) for name in weights.projection_names)
        if info.has_embed:
            self.embedding = embedding_of(tensors)
        if info.has_head:
            self.head = HeadWeights.from_tensors(tensors)
            if self.packs:
                self.pack_queue.append((None, "lm_head"))
        log.debug("block %d ready (layers %d-%d)", index, info.first_layer, info.end_layer - 1)

    def load_blocks(self, indices: list[int]) -> None:
        """Read blocks from the store on disk (those not held yet)."""
        for i in indices:
            if i not in self.block_data:
                info = self.manifest.blocks[i]
                self.add_block(i, read_block_file(self.manifest.block_path(i), info), verify=False)

    def blocks_for(self, first_layer: int, end_layer: int) -> list[int]:
        """Every block a runner of layers [first_layer, end_layer) needs: the layers' own,
        the first block (embedding) at layer 0, the last (head) at the last layer."""
        indices = self.manifest.blocks_for_layers(first_layer, end_layer)
        if first_layer == 0:
            indices = sorted({0, *indices})
        if end_layer == self.arch.num_layers:
            indices = sorted({*indices, self.manifest.num_blocks - 1})
        return indices

    def holds_layers(self, start: int, end: int) -> bool:
        return all(layer in self.layers for layer in range(start, end))

    @property
    def holds_whole_model(self) -> bool:
        """Every layer, the embedding and the head are here (a full local instance)."""
        return (
            self.embedding is not None
            and self.head is not None
            and len(self.layers) == self.arch.num_layers
        )

    # ---- gradual work ----------------------------------------------------------------

    def step_work(self, num_seqs: int) -> None:
        """A step's share of fusing and packing (see `fuse_some`, `pack_some`), skipped
        while the compile thread settles them."""
        if (self.fuse_queue or self.pack_queue) and self.lock.acquire(blocking=False):
            try:
                if self.fuse_queue:
                    self.fuse_some()
                if self.pack_queue and num_seqs >= 2:
                    self.pack_some()
            finally:
                self.lock.release()

    def settle(self) -> None:
        """Finish fusing and packing now (the compile thread, before it compiles: graphs for
        the weights the steps will have)."""
        with self.lock:
            while self.fuse_queue:
                self.fuse_some()
            while self.pack_queue:
                self.pack_some()

    def pack_some(self) -> int:
        """Pack queued projections, at most `max_pack_bytes_per_step` of them (at least one).

        Called on steps of 2 or more sequences, so a node that is still receiving blocks or
        serves one sequence at a time spends nothing on packing; returns the bytes packed.
        """
        done, budget = 0, self.config.max_pack_bytes_per_step
        while self.pack_queue:
            layer, name = self.pack_queue[0]
            owner = self.head if layer is None else self.layers[layer]
            lin = getattr(owner, name)
            if done and done + lin.num_bytes > budget:
                break
            self.pack_queue.popleft()
            self.num_packed += 1
            packed = replace(owner, **{name: lin.with_packing()})
            if layer is None:
                self.head = packed
            else:
                self.layers[layer] = packed
            done += lin.num_bytes
        return done

    def fuse_some(self) -> int:
        """Fuse queued layers' q/k/v and gate/up, at most `max_pack_bytes_per_step` of copies
        (at least one layer); returns the bytes copied.

        Only stores written before version 3 queue layers here (newer ones hold the fused
        matrices: nothing to copy). Called on every step, so a block is usable the moment it
        lands (fusing copies ~2/3 of a layer's bytes: done as blocks landed, a scale-out would
        wait for it, as it did for packing) and a few steps later every layer runs fused.
        Fused layers join the packing queue, so packing packs the fused matrices.
        """
        done, budget = 0, self.config.max_pack_bytes_per_step
        while self.fuse_queue:
            layer = self.fuse_queue[0]
            cost = self.layers[layer].fusable_bytes
            if done and done + cost > budget:
                break
            self.fuse_queue.popleft()
            fused = self.layers[layer] = self.layers[layer].fused()
            if self.packs:
                self.pack_queue.extend((layer, name) for name in fused.projection_names)
            done += cost
        return done

    @property
    def packing_settled(self) -> bool:
        """Neither fusing nor packing is half done (a half-converted layer stack would
        recompile the graph)."""
        return not self.fuse_queue and (not self.pack_queue or self.num_packed == 0)
