"""`ModelRunner`: executes any contiguous layer range of the blocks it holds.

A runner owns a layer range [first_layer, end_layer) — the KV cache of exactly those layers —
and any subset of blocks, added one at a time as they arrive (from a file, or a buffer a peer
sent). How a block's bytes reach the device and become weights is `BlockWeights`'
(`surge.engine.block_weights`, the device-copy path); this file is the step path. Its three
calls map a step onto the model:

    embed(token_ids) -> hidden           (needs the first block)
    run_layers(start, end, hidden, batch) -> hidden
    logits(hidden, batch) -> [B, vocab]  (needs the last block; at each sequence's last token)

Hidden states are padded [B, Q, hidden]; `BatchMeta` says which rows are real. Knows nothing
of networks: `surge.engine.hidden` turns hidden states into bytes for whoever carries them.
"""

import logging
import threading
from typing import TYPE_CHECKING

import torch

from surge.config import EngineConfig
from surge.engine import gemv
from surge.engine.attention import AttnContext
from surge.engine.batch import BatchMeta
from surge.engine.block_weights import BlockWeights
from surge.engine.cuda_graphs import CudaGraphDecode, TorchCudaGraphs
from surge.engine.device import compute_dtype, decode_path, pick_device
from surge.engine.devmem import DeviceMemory, device_memory
from surge.engine.host_malloc import keep_freed_host_memory
from surge.engine.kv_cache import PagedKVCache
from surge.engine.model import RopeTable, decoder_layer, final_logits
from surge.errors import SurgeError
from surge.model.blocks import torch_dtype
from surge.model.manifest import Manifest

if TYPE_CHECKING:
    from surge.engine.compiled import DecodeGraph

log = logging.getLogger(__name__)


class ModelRunner:
    """Runs layer ranges of the blocks it holds (`BlockWeights`), with a paged KV cache."""

    def __init__(
        self,
        manifest: Manifest,
        config: EngineConfig = EngineConfig(),
        layer_range: tuple[int, int] | None = None,
        memory: DeviceMemory | None = None,
        compile_gate: threading.Event | None = None,
    ) -> None:
        """`compile_gate`: the decode graphs compile only while it is set (a node agent's:
        set while the node is quiet, `runtime/node/compile_quiet.py`); None: at once."""
        self.manifest = manifest
        self.arch = manifest.arch
        self.config = config.validate()
        self.device = pick_device(config.device)
        if self.device.type == "cpu":
            keep_freed_host_memory()  # a prefill's intermediates reused, not faulted anew
        self.dtype = compute_dtype(config.dtype, self.device, torch_dtype(self.arch.dtype))
        """What weights, activations and the KV cache are in (bfloat16 on CUDA)."""
        first, end = layer_range or (0, self.arch.num_layers)
        if not 0 <= first < end <= self.arch.num_layers:
            raise SurgeError(
                f"layer range [{first}, {end}) is not within the model's "
                f"{self.arch.num_layers} layers"
            )
        self.first_layer, self.end_layer = first, end
        memory = memory if memory is not None else device_memory(config.device)
        self.weights = BlockWeights(manifest, self.config, self.device, memory, self.dtype)
        """The blocks held, as layers, embedding and head (the device-copy path)."""
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
        if self.device.type == "cpu" and self.dtype == torch.float32:
            gemv.load()  # one-row projections through surge's kernel (if setup.sh built it)
        path = decode_path(self.device, config.cuda_graphs, config.compile_decode)
        self.cuda_graphs: CudaGraphDecode | None = None
        """A whole model's decode steps as CUDA graphs (on CUDA, `EngineConfig.cuda_graphs`;
        a test sets one with another capture on the CPU), else None."""
        if path == "cuda_graphs":
            self.cuda_graphs = CudaGraphDecode(
                self.decode_logits,
                self.kv.scratch_page,
                config.page_size_tokens,
                self.device,
                TorchCudaGraphs(),
                max_batch=config.max_num_seqs,
            )
        self.decode_graph: DecodeGraph | None = None
        if path == "compiled" and hasattr(torch.compiler, "set_stance"):
            # Imported only then: torch._dynamo adds ~1 s to start-up.
            from surge.engine import compiled

            self.decode_graph = compiled.DecodeGraph(
                self.compile_args, self.weights.settle, gate=compile_gate
            )
        elif path == "compiled":
            log.info("torch %s lacks set_stance: decode steps stay eager", torch.__version__)
        """The compiled decode step (`EngineConfig.compile_decode`), else None."""
        self.compile_started = False  # the background compile, once the layers were here

    # ---- blocks ----------------------------------------------------------------------

    def add_block(self, index: int, buf: bytearray | memoryview, verify: bool = True) -> None:
        """Make block `index` usable from `buf` (a buffer read from disk or received; see
        `BlockWeights.add_block`)."""
        self.weights.add_block(index, buf, verify)
        self._start_compile()

    def install_block(self, index: int, data: torch.Tensor) -> None:
        """Take in block `index` from its bytes on the device, already arrived (see
        `BlockWeights.install_block`); no copy."""
        self.weights.install_block(index, data)
        self._start_compile()

    def load_blocks(self, indices: list[int] | None = None) -> None:
        """Read blocks from the store on disk (default: every block this range needs)."""
        if indices is None:
            indices = self.weights.blocks_for(self.first_layer, self.end_layer)
        self.weights.load_blocks(indices)
        self._start_compile()

    def _start_compile(self) -> None:
        """Once every layer (and, for a whole model, the embedding and head) is here, compile
        the decode graphs in the background: before the first request on a warm node, beside
        the eager steps on one serving while its blocks land (`surge.engine.compiled`)."""
        if self.decode_graph is None or self.compile_started:
            return
        whole_range = self.first_layer == 0 and self.end_layer == self.arch.num_layers
        # A whole model's graph also needs the embedding and the head.
        if not (self.holds_whole_model if whole_range else self.weights.holds_layers(
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
        w = self.weights
        layers = tuple(w.layers[layer] for layer in range(self.first_layer, self.end_layer))
        caches = (self.k_layers, self.v_layers)
        if which == MODEL:
            ids = torch.zeros(batch, 1, dtype=torch.int64, device=self.device)
            return (ids, w.embedding, layers, w.head, self.arch, ctx, *caches)
        x = torch.zeros(batch, 1, self.arch.hidden_size, dtype=self.dtype, device=self.device)
        return (x, layers, self.arch, ctx, *caches)

    # ---- execution -------------------------------------------------------------------

    @torch.inference_mode()
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B, Q] -> hidden states [B, Q, hidden]."""
        embedding = self.weights.embedding
        if embedding is None:
            raise RuntimeError("embed() needs the first block, which this runner lacks")
        return embedding[token_ids.to(self.device)]

    def _before_step(self, batch: BatchMeta, which: str) -> bool:
        """Fuse and pack a little (gradually, see `fuse_some`, `pack_some`); whether this
        step runs compiled (a pure decode step, fusing and packing settled, a graph of
        `which` ready for its batch: else it runs as with `compile_decode` off)."""
        self.weights.step_work(batch.num_seqs)
        graph = self.decode_graph
        if graph is None or batch.max_q_len != 1 or not self.weights.packing_settled:
            return False
        return graph.use(which, batch.num_seqs)

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
        if not self.weights.holds_layers(start, end):
            missing = [layer for layer in range(start, end) if layer not in self.weights.layers]
            raise RuntimeError(f"runner lacks layers {missing}")
        compiled = self._before_step(batch, "stack")  # `surge.engine.compiled.STACK`
        return self._layers(start, end, hidden, batch, compiled)

    def _layers(
        self, start: int, end: int, hidden: torch.Tensor, batch: BatchMeta, compiled: bool
    ) -> torch.Tensor:
        """`run_layers` after its checks and `_before_step`."""
        ctx = self.kv.prepare(batch, self.rope, whole_pages=compiled)
        x = hidden.to(self.device, self.dtype)
        if compiled:
            assert self.decode_graph is not None
            lo, hi = start - self.first_layer, end - self.first_layer
            layers = tuple(self.weights.layers[layer] for layer in range(start, end))
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
                x, self.weights.layers[layer], self.arch, ctx, self.k_layers[i], self.v_layers[i]
            )
        return x

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, batch: BatchMeta) -> torch.Tensor:
        """float32 logits [B, vocab] at each sequence's last new token."""
        head = self.weights.head
        if head is None:
            raise RuntimeError("logits() needs the last block, which this runner lacks")
        if all(q == hidden.shape[1] for q in batch.q_lens):  # decode, or equal pieces: a view
            rows = hidden[:, -1]
        else:
            last = torch.tensor([q - 1 for q in batch.q_lens], device=hidden.device)
            rows = hidden[torch.arange(batch.num_seqs, device=hidden.device), last]
        return final_logits(rows.to(self.device), head, self.arch)

    def forward(self, token_ids: torch.Tensor, batch: BatchMeta) -> torch.Tensor:
        """The whole model in one call: token ids [B, Q] -> logits [B, vocab]."""
        if self.cuda_graphs is not None and self.holds_whole_model:
            return self._forward_graphed(token_ids, batch)
        if self.decode_graph is not None and self.holds_whole_model:
            return self._forward_compiled(token_ids, batch)
        hidden = self.embed(token_ids)
        hidden = self.run_layers(self.first_layer, self.end_layer, hidden, batch)
        return self.logits(hidden, batch)

    @property
    def holds_whole_model(self) -> bool:
        """Every layer, the embedding and the head are here (a full local instance)."""
        whole_range = self.end_layer - self.first_layer == self.arch.num_layers
        return whole_range and self.weights.holds_whole_model

    @torch.inference_mode()
    def _forward_compiled(self, token_ids: torch.Tensor, batch: BatchMeta) -> torch.Tensor:
        """`forward` with compiled decode: a decode step is one graph from token ids to
        logits (embedding, layers, final norm and lm_head); other steps run eager."""
        if not self._before_step(batch, "model"):  # `surge.engine.compiled.MODEL`
            hidden = self._layers(0, self.end_layer, self.embed(token_ids), batch, False)
            return self.logits(hidden, batch)
        assert self.decode_graph is not None
        w = self.weights
        assert w.embedding is not None and w.head is not None
        ctx = self.kv.prepare(batch, self.rope, whole_pages=True)
        layers = tuple(w.layers[layer] for layer in range(self.arch.num_layers))
        ids = token_ids.to(self.device)
        ids = ids if ids.is_inference() else ids.clone()  # what the graphs were compiled for
        args = (self.arch, ctx, self.k_layers, self.v_layers)
        logits = self.decode_graph.model(ids, w.embedding, layers, w.head, *args)
        if logits is not None:
            return logits
        hidden = self._eager_layers(0, self.end_layer, self.embed(token_ids), ctx)
        return self.logits(hidden, batch)

    @torch.inference_mode()
    def _forward_graphed(self, token_ids: torch.Tensor, batch: BatchMeta) -> torch.Tensor:
        """`forward` on CUDA: a pure decode step, once the weights are settled, replays its
        bucket's CUDA graph (`surge.engine.cuda_graphs`); other steps run eager."""
        assert self.cuda_graphs is not None
        self.weights.step_work(batch.num_seqs)
        if batch.max_q_len == 1 and self.weights.packing_settled:
            ctx = self.kv.prepare(batch, self.rope, whole_pages=True, direct=False)
            logits = self.cuda_graphs(token_ids.to(self.device), ctx)
            if logits is not None:
                return logits
            hidden = self._eager_layers(0, self.end_layer, self.embed(token_ids), ctx)
            return self.logits(hidden, batch)
        hidden = self._layers(0, self.end_layer, self.embed(token_ids), batch, False)
        return self.logits(hidden, batch)

    def decode_logits(self, token_ids: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """A whole model's decode step, eager, from tensors only (what a CUDA graph of
        `CudaGraphDecode` captures): token ids [B, 1] -> float32 logits [B, vocab]."""
        w = self.weights
        assert w.embedding is not None and w.head is not None
        x = self._eager_layers(0, self.end_layer, w.embedding[token_ids], ctx)
        return final_logits(x[:, -1], w.head, self.arch)

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
