"""`DecodeGraph`: the layer stack of a decode step, compiled with `torch.compile` (inductor).

Opt-in (`EngineConfig.compile_decode`). Why: at batch 1 a decode step of a small model is
~35 eager ops per layer besides its 7 projections (norms, rope, KV write and page gather,
attention, residual adds), each paying PyTorch's per-op dispatch; inductor fuses the
element-wise chains into a few C++ loops and runs the whole stack from one call. The
projections stay library calls (MKL gemv; oneDNN's packed kernel through
`surge::packed_linear`), SDPA stays ATen's. Logits differ from eager in the last bits only
(inductor sums the norms in its own order), so only a near-tie could flip a greedy token;
measured, the tokens are the eager path's (tests/engine/test_compiled_decode.py).

What flows: `ModelRunner.run_layers` hands a pure-decode step (every sequence 1 new token)
here with the step's `AttnContext`, the layers' weights and KV-cache views; prefill and mixed
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

import torch
from torch._dynamo.utils import counters

from surge.engine.model import AttnContext, LayerWeights, decoder_layer
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
        self.num_calls = 0
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
        # Sizes that move from step to step; size-1 dims (batch 1) stay specialized.
        for t in (x, ctx.cos, ctx.sin, ctx.write_slots, ctx.gather_pages):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(ctx.gather_pages, 1)
        if ctx.mask is not None:
            torch._dynamo.maybe_mark_dynamic(ctx.mask, 0)
            torch._dynamo.maybe_mark_dynamic(ctx.mask, 3)
        before = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        out = self.fn(x, layers, arch, ctx, k_caches, v_caches)
        self.num_calls += 1
        if counters["stats"]["unique_graphs"] != before:
            took = time.perf_counter() - start
            self.num_compiles += 1
            self.compile_s += took
            log.info(
                "compiled the decode step (batch %d, %d layers) in %.1f s (compile %d, %.1f s "
                "in all)",
                x.shape[0],
                len(layers),
                took,
                self.num_compiles,
                self.compile_s,
            )
        return out
