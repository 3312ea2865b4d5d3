"""`ModelRunner`: executes any contiguous layer range of the blocks it holds.

A runner owns a layer range [first_layer, end_layer) — the KV cache of exactly those layers —
and any subset of blocks, added one at a time as they arrive (from a file, or a buffer a peer
sent). Its three calls map a step onto the model:

    embed(token_ids) -> hidden           (needs the first block)
    run_layers(start, end, hidden, batch) -> hidden
    logits(hidden, batch) -> [B, vocab]  (needs the last block; at each sequence's last token)

Hidden states are padded [B, Q, hidden]; `BatchMeta` says which rows are real. Knows nothing
of networks: `surge.engine.hidden` turns hidden states into bytes for whoever carries them.
"""

import logging
import threading
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from surge.config import EngineConfig
from surge.engine import gemv
from surge.engine.attention import AttnContext
from surge.engine.batch import BatchMeta
from surge.engine.device import pick_device
from surge.engine.devmem import DeviceMemory, device_memory, move_block
from surge.engine.kv_cache import PagedKVCache
from surge.engine.linear import can_pack
from surge.engine.model import (
    HeadWeights,
    LayerWeights,
    RopeTable,
    decoder_layer,
    embedding_of,
    final_logits,
)
from surge.errors import SurgeError
from surge.model.blocks import read_block_file, tensors_in, torch_dtype
from surge.model.manifest import Manifest, verify_block

if TYPE_CHECKING:
    from surge.engine.compiled import DecodeGraph

log = logging.getLogger(__name__)


class ModelRunner:
    """Holds blocks of one model and runs layer ranges of them, with a paged KV cache."""

    def __init__(
        self,
        manifest: Manifest,
        config: EngineConfig = EngineConfig(),
        layer_range: tuple[int, int] | None = None,
        memory: DeviceMemory | None = None,
    ) -> None:
        self.manifest = manifest
        self.arch = manifest.arch
        self.config = config.validate()
        self.device = pick_device(config.device)
        self.memory = memory if memory is not None else device_memory(config.device)
        """How block bytes reach the device (`surge.engine.devmem`; a test passes a fake)."""
        self.dtype = torch_dtype(self.arch.dtype)
        first, end = layer_range or (0, self.arch.num_layers)
        if not 0 <= first < end <= self.arch.num_layers:
            raise SurgeError(
                f"layer range [{first}, {end}) is not within the model's "
                f"{self.arch.num_layers} layers"
            )
        self.first_layer, self.end_layer = first, end
        self.kv = PagedKVCache(
            num_layers=end - first,
            num_pages=config.num_pages,
            page_size_tokens=config.page_size_tokens,
            num_kv_heads=self.arch.num_kv_heads,
            head_dim=self.arch.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self.k_layers, self.v_layers = tuple(self.kv.k), tuple(self.kv.v)
        """Per-layer views of the cache, made once (not 2 views per layer per step)."""
        self.rope = RopeTable(self.arch.rope, self.arch.head_dim, self.device, self.dtype)
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
            and self.device.type == "cpu"
            and can_pack(torch.empty(1, 1, dtype=self.dtype))
        )
        """Whether projections get packed copies (gradually, `pack_some`)."""
        if self.device.type == "cpu" and self.dtype == torch.float32:
            gemv.load()  # one-row projections through surge's kernel (if setup.sh built it)
        self.pack_queue: deque[tuple[int | None, str]] = deque()
        """Projections still unpacked: (layer, field), or (None, "lm_head") for the head."""
        self.num_packed = 0
        """Projections packed so far (with `pack_queue`: whether packing is under way)."""
        self.fuse_queue: deque[int] = deque()
        """Layers of an older store (separate q/k/v, gate/up) still to fuse
        (`EngineConfig.fuse_projections`); stays empty for a version-3 store."""
        self.weights_lock = threading.Lock()
        """Held while fusing or packing (the steps' gradual work, or the compile thread's
        `settle_weights`): never both at once."""
        self.decode_graph: DecodeGraph | None = None
        if config.compile_decode and hasattr(torch.compiler, "set_stance"):
            # Imported only then: torch._dynamo adds ~1 s to start-up.
            from surge.engine import compiled

            self.decode_graph = compiled.DecodeGraph(self.compile_args, self.settle_weights)
        elif config.compile_decode:
            log.info("torch %s lacks set_stance: decode steps stay eager", torch.__version__)
        """The compiled decode step (`EngineConfig.compile_decode`), else None."""
        self.compile_started = False  # the background compile, once the layers were here

    # ---- blocks ----------------------------------------------------------------------

    def add_block(self, index: int, buf: bytearray | memoryview, verify: bool = True) -> None:
        """Make block `index` usable from `buf` (a buffer read from disk or received): its
        bytes move to the device (`devmem.move_block`: one copy, or on the CPU the buffer
        itself), and the block is taken in once they arrived."""
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
        self._start_compile()

    def _start_compile(self) -> None:
        """Once every layer (and, for a whole model, the embedding and head) is here, compile
        the decode graphs in the background: before the first request on a warm node, beside
        the eager steps on one serving while its blocks land (`surge.engine.compiled`)."""
        if self.decode_graph is None or self.compile_started:
            return
        whole_range = self.first_layer == 0 and self.end_layer == self.arch.num_layers
        # A whole model's graph also needs the embedding and the head.
        if not (self.holds_whole_model if whole_range else self.holds_layers(
                self.first_layer, self.end_layer)):  # fmt: skip
            return
        from surge.engine.compiled import MODEL, STACK

        which = MODEL if whole_range else STACK
        self.compile_started = self.decode_graph.start([(which, 1), (which, 2)])

    def compile_args(self, job: tuple[str, int]) -> tuple:
        """Scratch inputs of a decode graph (`DecodeGraph`'s compile thread): a step of
        `batch` sequences writing only the cache's reserved scratch page."""
        from surge.engine.compiled import MODEL

        which, batch = job
        ctx = self.kv.scratch_context(batch, self.rope)
        layers = tuple(self.layers[layer] for layer in range(self.first_layer, self.end_layer))
        caches = (self.k_layers, self.v_layers)
        if which == MODEL:
            ids = torch.zeros(batch, 1, dtype=torch.int64, device=self.device)
            return (ids, self.embedding, layers, self.head, self.arch, ctx, *caches)
        x = torch.zeros(batch, 1, self.arch.hidden_size, dtype=self.dtype, device=self.device)
        return (x, layers, self.arch, ctx, *caches)

    def settle_weights(self) -> None:
        """Finish fusing and packing now (the compile thread, before it compiles: graphs for
        the weights the steps will have)."""
        with self.weights_lock:
            while self.fuse_queue:
                self.fuse_some()
            while self.pack_queue:
                self.pack_some()

    def load_blocks(self, indices: list[int] | None = None) -> None:
        """Read blocks from the store on disk (default: every block this range needs)."""
        if indices is None:
            indices = self.manifest.blocks_for_layers(self.first_layer, self.end_layer)
            if self.first_layer == 0:
                indices = sorted({0, *indices})
            if self.end_layer == self.arch.num_layers:
                indices = sorted({*indices, self.manifest.num_blocks - 1})
        for i in indices:
            if i not in self.block_data:
                info = self.manifest.blocks[i]
                self.add_block(i, read_block_file(self.manifest.block_path(i), info), verify=False)

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

    def holds_layers(self, start: int, end: int) -> bool:
        return all(layer in self.layers for layer in range(start, end))

    # ---- execution -------------------------------------------------------------------

    @torch.inference_mode()
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B, Q] -> hidden states [B, Q, hidden]."""
        if self.embedding is None:
            raise RuntimeError("embed() needs the first block, which this runner lacks")
        return self.embedding[token_ids.to(self.device)]

    def _before_step(self, batch: BatchMeta) -> bool:
        """Fuse and pack a little (gradually, see `fuse_some`, `pack_some`); whether this
        step runs compiled (a pure decode step, fusing and packing settled)."""
        if (self.fuse_queue or self.pack_queue) and self.weights_lock.acquire(blocking=False):
            try:  # not while the compile thread settles them
                if self.fuse_queue:
                    self.fuse_some()
                if self.pack_queue and batch.num_seqs >= 2:
                    self.pack_some()
            finally:
                self.weights_lock.release()
        return self.decode_graph is not None and batch.max_q_len == 1 and self.packing_settled

    @torch.inference_mode()
    def run_layers(
        self, start: int, end: int, hidden: torch.Tensor, batch: BatchMeta
    ) -> torch.Tensor:
        """Run layers [start, end) on hidden states [B, Q, hidden], updating their KV cache."""
        if not self.first_layer <= start < end <= self.end_layer:
            raise RuntimeError(
                f"layers [{start}, {end}) are outside this runner's range "
                f"[{self.first_layer}, {self.end_layer})"
            )
        if not self.holds_layers(start, end):
            missing = [layer for layer in range(start, end) if layer not in self.layers]
            raise RuntimeError(f"runner lacks layers {missing}")
        return self._layers(start, end, hidden, batch, self._before_step(batch))

    def _layers(
        self, start: int, end: int, hidden: torch.Tensor, batch: BatchMeta, compiled: bool
    ) -> torch.Tensor:
        """`run_layers` after its checks and `_before_step`."""
        ctx = self.kv.prepare(batch, self.rope, whole_pages=compiled)
        x = hidden.to(self.device, self.dtype)
        if compiled:
            assert self.decode_graph is not None
            lo, hi = start - self.first_layer, end - self.first_layer
            layers = tuple(self.layers[layer] for layer in range(start, end))
            k_caches, v_caches = self.k_layers[lo:hi], self.v_layers[lo:hi]
            # Graphs are compiled for inference tensors (dynamo guards on the dispatch keys):
            # hidden states that came over the wire are copied into one (a row per sequence).
            x = x if x.is_inference() else x.clone()
            out = self.decode_graph(x, layers, self.arch, ctx, k_caches, v_caches)
            if out is not None:
                return out
        return self._eager_layers(start, end, x, ctx)

    def _eager_layers(
        self, start: int, end: int, x: torch.Tensor, ctx: AttnContext
    ) -> torch.Tensor:
        for layer in range(start, end):
            i = layer - self.first_layer
            x = decoder_layer(
                x, self.layers[layer], self.arch, ctx, self.k_layers[i], self.v_layers[i]
            )
        return x

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, batch: BatchMeta) -> torch.Tensor:
        """float32 logits [B, vocab] at each sequence's last new token."""
        if self.head is None:
            raise RuntimeError("logits() needs the last block, which this runner lacks")
        if all(q == hidden.shape[1] for q in batch.q_lens):  # decode, or equal pieces: a view
            rows = hidden[:, -1]
        else:
            last = torch.tensor([q - 1 for q in batch.q_lens], device=hidden.device)
            rows = hidden[torch.arange(batch.num_seqs, device=hidden.device), last]
        return final_logits(rows.to(self.device), self.head, self.arch)

    def forward(self, token_ids: torch.Tensor, batch: BatchMeta) -> torch.Tensor:
        """The whole model in one call: token ids [B, Q] -> logits [B, vocab]."""
        if self.decode_graph is not None and self.holds_whole_model:
            return self._forward_compiled(token_ids, batch)
        hidden = self.embed(token_ids)
        hidden = self.run_layers(self.first_layer, self.end_layer, hidden, batch)
        return self.logits(hidden, batch)

    @property
    def holds_whole_model(self) -> bool:
        """Every layer, the embedding and the head are here (a full local instance)."""
        return (
            self.embedding is not None
            and self.head is not None
            and len(self.layers) == self.end_layer - self.first_layer == self.arch.num_layers
        )

    @torch.inference_mode()
    def _forward_compiled(self, token_ids: torch.Tensor, batch: BatchMeta) -> torch.Tensor:
        """`forward` with compiled decode: a decode step is one graph from token ids to
        logits (embedding, layers, final norm and lm_head); other steps run eager."""
        if not self._before_step(batch):
            hidden = self._layers(0, self.end_layer, self.embed(token_ids), batch, False)
            return self.logits(hidden, batch)
        assert self.decode_graph is not None
        assert self.embedding is not None and self.head is not None
        ctx = self.kv.prepare(batch, self.rope, whole_pages=True)
        layers = tuple(self.layers[layer] for layer in range(self.arch.num_layers))
        ids = token_ids.to(self.device)
        ids = ids if ids.is_inference() else ids.clone()  # what the graphs were compiled for
        args = (self.arch, ctx, self.k_layers, self.v_layers)
        logits = self.decode_graph.model(ids, self.embedding, layers, self.head, *args)
        if logits is not None:
            return logits
        hidden = self._eager_layers(0, self.end_layer, self.embed(token_ids), ctx)
        return self.logits(hidden, batch)

    def free(self, seq_id: int) -> None:
        """Drop a sequence's KV cache."""
        self.kv.free(seq_id)

    def export_kv(self, seq_id: int, num_tokens: int, first_token: int = 0) -> torch.Tensor:
        """K and V of a sequence's tokens [first_token, num_tokens) for this runner's
        layers: [layers, 2, num_tokens - first_token, kv_heads, head_dim] (a copy; for KV
        migration; a later token range tops up an earlier copy)."""
        slots = torch.tensor(self.kv.slots_of(seq_id)[first_token:num_tokens], device=self.device)
        if len(slots) != num_tokens - first_token or not 0 <= first_token < num_tokens:
            raise ValueError(f"sequence {seq_id} has fewer than {num_tokens} cached tokens")
        return torch.stack((self.kv.k[:, slots], self.kv.v[:, slots]), dim=1).cpu()

    def import_kv(
        self, seq_id: int, first_layer: int, kv: torch.Tensor, first_token: int = 0
    ) -> None:
        """Write migrated K/V [layers, 2, n, kv_heads, head_dim] for layers from
        `first_layer`, tokens [first_token, first_token + n)."""
        num_layers, _, n = kv.shape[:3]
        lo = first_layer - self.first_layer
        if lo < 0 or lo + num_layers > self.end_layer - self.first_layer:
            raise ValueError(f"layers {first_layer}+{num_layers} are outside this runner")
        self.kv.ensure(seq_id, first_token + n)
        slots = torch.tensor(
            self.kv.slots_of(seq_id)[first_token : first_token + n], device=self.device
        )
        kv = kv.to(self.device, self.dtype)
        self.kv.k[lo : lo + num_layers, slots] = kv[:, 0]
        self.kv.v[lo : lo + num_layers, slots] = kv[:, 1]
