"""`DecodeGraph`: the layer stack of a decode step, compiled with `torch.compile` (inductor).

Opt-in (`EngineConfig.compile_decode`). Why: at batch 1 a decode step of a small model is
~35 eager ops per layer besides its 7 projections (norms, rope, KV write and page gather,
attention, residual adds), each paying PyTorch's per-op dispatch; inductor fuses the
element-wise chains into a few C++ loops and runs the whole stack from one call. The
projections stay opaque calls (one row: surge's `surge::gemv_row`, `engine/gemv.py`, which
the runner builds, else MKL's gemv; more rows: oneDNN's packed kernel through
`surge::packed_linear`), SDPA stays ATen's. Logits differ from eager in the last bits only
(inductor sums the norms in its own order), so only a near-tie could flip a greedy token;
measured, the tokens are the eager path's (tests/engine/test_compiled_decode.py).

What flows: a runner holding the whole model (`ModelRunner.forward`, a local instance) hands
a pure-decode step (every sequence 1 new token) to `DecodeGraph.model`: token ids to float32
logits in one graph (embedding, layers, final norm, lm_head), because the eager ops around
the graph cost more than their arithmetic here (each step streams ~92 MB of weights through
the caches, so the Python and dispatch work after it runs cache-cold). A pipeline stage's
`ModelRunner.run_layers` hands its layers to `DecodeGraph.__call__` (hidden states in and
out). Both get the step's `AttnContext`, the weights and the KV-cache views; prefill and mixed
steps stay eager (matmul-bound; their query lengths would only add graphs). Shapes that change
step to step are marked dynamic (batch, pages gathered, keys attended), so the graphs are few
and fixed: one for batch 1, one for every batch >= 2 (and one more for each when packing,
`EngineConfig.pack_cpu_weights`, has swapped in packed projections; inductor's cache makes that
one quick). Keys are attended a whole page at a time under a mask (`AttnContext.num_keys`
None), so no per-step int enters the graph. Each compile is logged with its time; the step
that triggers it pays it.
"""

import logging
import os
import shutil
import time
from collections.abc import Callable

import torch
from torch._dynamo.utils import counters

from surge.engine.attention import AttnContext
from surge.engine.model import HeadWeights, LayerWeights, decoder_layer, final_logits
from surge.errors import SurgeError
from surge.model.arch import ModelArch

log = logging.getLogger(__name__)


def decode_stack(
    x: torch.Tensor,
    layers: tuple[LayerWeights, ...],
    arch: ModelArch,
    ctx: AttnContext,
    k_caches: tuple[torch.Tensor, ...],
    v_caches: tuple[torch.Tensor, ...],
) -> torch.Tensor:
    """The eager layers, one after another (dynamo unrolls the loop into one graph)."""
    for w, k_cache, v_cache in zip(layers, k_caches, v_caches, strict=True):
        x = decoder_layer(x, w, arch, ctx, k_cache, v_cache)
    return x


def decode_model(
    token_ids: torch.Tensor,
    embedding: torch.Tensor,
    layers: tuple[LayerWeights, ...],
    head: HeadWeights,
    arch: ModelArch,
    ctx: AttnContext,
    k_caches: tuple[torch.Tensor, ...],
    v_caches: tuple[torch.Tensor, ...],
) -> torch.Tensor:
    """Token ids [B, 1] -> float32 logits [B, vocab]: embedding, every layer, final norm and
    lm_head in one graph (a runner that holds the whole model)."""
    x = decode_stack(embedding[token_ids], layers, arch, ctx, k_caches, v_caches)
    return final_logits(x[:, -1], head, arch)


class DecodeGraph:
    """One runner's compiled decode step (compiled lazily, per shape class, on first use)."""

    def __init__(self) -> None:
        compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
        if not compiler:
            raise SurgeError(
                "compile_decode needs a C++ compiler for inductor (install g++, or set CXX); "
                "or turn compile_decode off"
            )
        # No size/stride/alignment asserts in inductor's wrapper (~60 calls per step at 6
        # layers): dynamo's guards already check every input's sizes and strides. The
        # wrapper itself in C++ (`cpp_wrapper`): the Python one costs ~0.3-0.5 ms per step
        # (its kernel calls and views); measured on this project's VM, 100mb preset, one
        # thread, same tokens: batch-1 decode 6.0-6.6 -> 5.5-6.1 ms of CPU per step.
        options = {"size_asserts": False, "alignment_asserts": False, "cpp_wrapper": True}
        self.fn = torch.compile(decode_stack, dynamic=None, options=options)
        self.model_fn = torch.compile(decode_model, dynamic=None, options=options)
        self.num_calls = 0
        self.num_model_calls = 0
        """Of `num_calls`, those through `model` (token ids to logits in one graph)."""
        self.num_compiles = 0
        """Graphs compiled for this runner (each logged with its time)."""
        self.compile_s = 0.0

    def __call__(
        self,
        x: torch.Tensor,
        layers: tuple[LayerWeights, ...],
        arch: ModelArch,
        ctx: AttnContext,
        k_caches: tuple[torch.Tensor, ...],
        v_caches: tuple[torch.Tensor, ...],
    ) -> torch.Tensor:
        """Hidden states [B, 1, hidden] through `layers` (a pipeline stage's range)."""
        torch._dynamo.maybe_mark_dynamic(x, 0)
        return self._run(self.fn, "", len(layers), x, layers, arch, ctx, k_caches, v_caches)

    def model(
        self,
        token_ids: torch.Tensor,
        embedding: torch.Tensor,
        layers: tuple[LayerWeights, ...],
        head: HeadWeights,
        arch: ModelArch,
        ctx: AttnContext,
        k_caches: tuple[torch.Tensor, ...],
        v_caches: tuple[torch.Tensor, ...],
    ) -> torch.Tensor:
        """Token ids [B, 1] -> float32 logits [B, vocab] through the whole model, one call."""
        torch._dynamo.maybe_mark_dynamic(token_ids, 0)
        args = (token_ids, embedding, layers, head, arch, ctx, k_caches, v_caches)
        self.num_model_calls += 1
        return self._run(self.model_fn, " with embedding and head", len(layers), *args)

    def _run(
        self, fn: Callable[..., torch.Tensor], what: str, num_layers: int, *args: object
    ) -> torch.Tensor:
        ctx = args[-3]
        assert isinstance(ctx, AttnContext)
        # Sizes that move from step to step; size-1 dims (batch 1) stay specialized.
        for t in (ctx.cos, ctx.sin, ctx.write_slots, ctx.gather_pages):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(ctx.gather_pages, 1)
        if ctx.mask is not None:
            torch._dynamo.maybe_mark_dynamic(ctx.mask, 0)
            torch._dynamo.maybe_mark_dynamic(ctx.mask, 3)
        before = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        out = fn(*args)
        self.num_calls += 1
        if counters["stats"]["unique_graphs"] != before:
            took = time.perf_counter() - start
            self.num_compiles += 1
            self.compile_s += took
            log.info(
                "compiled the decode step%s (batch %d, %d layers) in %.1f s (compile %d, "
                "%.1f s in all)",
                what,
                ctx.gather_pages.shape[0],
                num_layers,
                took,
                self.num_compiles,
                self.compile_s,
            )
        return out
