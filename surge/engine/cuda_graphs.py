"""`CudaGraphDecode`: a whole model's decode step replayed as a CUDA graph, one per bucket.

Why: at small batches a decode step on a GPU is hundreds of kernel launches of a few
microseconds' work each (norms, rope, the K/V write and page gather, attention, residual
adds beside the projections), so the CPU issuing them, not HBM, sets the step time; a CUDA
graph issues the whole step at once (vLLM v1 and nano-vllm capture decode the same way). It
pays only where launches dominate: decode steps (prefill is matmul-bound) of at most
`GRAPH_BATCHES[-1]` sequences; larger ones run eager.

What flows: the runner (`ModelRunner.forward`, a whole local model on CUDA) hands a pure
decode step — token ids [B, 1] and its `AttnContext` (`PagedKVCache.prepare(...,
whole_pages=True)`: every gathered page attended under a mask, so no key count is baked in)
— to `__call__`, which returns float32 logits [B, vocab], or None where no graph fits. A
graph is captured per bucket (batch rounded up to a `GRAPH_BATCHES` size, pages gathered
per sequence rounded up to a power of two) the first time a step needs it, from a
step whose every row writes and reads only the cache's scratch page; each later step
copies its inputs into the bucket's static tensors, padding rows and pages with the
scratch page (a padded row attends the scratch page's first slot only, so it stays
finite) and replays. The graph reads the weights where they are, so it is only used once
the weights are settled (`BlockWeights.packing_settled`: nothing swaps them afterwards).

Capturing goes through a seam (`GraphCapture`): `TorchCudaGraphs` over `torch.cuda` (the
warm-up on a side stream, capture into one memory pool shared by every bucket's graph,
replay), and `RerunGraphs`, which re-runs the captured function on replay: on the CPU it
tests everything here but the CUDA calls (tests/engine/test_cuda_path.py), which a
recording stand-in for `torch.cuda` checks. Owned by the engine; never run on a GPU yet
(docs/gpu.md).
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from surge.engine.attention import AttnContext

log = logging.getLogger(__name__)

GRAPH_BATCHES = (1, 2, 4, 8, 16, 32)
"""Batch sizes a graph is captured for; a step runs in the smallest that holds it (padded
rows cost a little compute, a graph per batch size would cost capture time and memory)."""
WARMUP_STEPS = 2
"""Eager runs of a bucket's step on a side stream before its capture (cuBLAS workspaces,
lazy inits: nothing may allocate for the first time inside a capture)."""


class Captured(Protocol):
    """A captured step: `replay()` recomputes `out` from the static inputs' current values."""

    out: torch.Tensor

    def replay(self) -> None: ...


class GraphCapture(Protocol):
    """How a step function becomes a replayable graph."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> Captured:
        """Capture `fn` (reading only static tensors) once; its output tensor is `out`."""
        ...


@dataclass
class _TorchCaptured:
    graph: Any
    out: torch.Tensor

    def replay(self) -> None:
        self.graph.replay()


class TorchCudaGraphs:
    """`GraphCapture` over `torch.cuda` (`cuda` is that module; a test passes a stand-in)."""

    def __init__(self, cuda: Any = torch.cuda) -> None:
        self.cuda = cuda
        self.pool: Any = None
        """One memory pool for every bucket's graph (they never replay at once)."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> Captured:
        cuda = self.cuda
        side = cuda.Stream()
        side.wait_stream(cuda.current_stream())
        with cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                fn()
        cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = cuda.graph_pool_handle()
        graph = cuda.CUDAGraph()
        with cuda.graph(graph, pool=self.pool):
            out = fn()
        return _TorchCaptured(graph, out)


@dataclass
class _Rerun:
    fn: Callable[[], torch.Tensor]
    out: torch.Tensor

    def replay(self) -> None:
        self.out.copy_(self.fn())


class RerunGraphs:
    """`GraphCapture` that re-runs the function on replay (the CPU, for tests): what it
    computes from the static tensors is what a replayed graph would."""

    def __init__(self) -> None:
        self.captures = 0

    def capture(self, fn: Callable[[], torch.Tensor]) -> Captured:
        self.captures += 1
        return _Rerun(fn, fn().clone())


@dataclass
class _Bucket:
    """One bucket's static inputs and its captured step."""

    ids: torch.Tensor
    ctx: AttnContext
    step: Captured | None = None


def _pow2_at_least(n: int) -> int:
    return 1 << max(1, (n - 1).bit_length())


class CudaGraphDecode:
    """Decode steps of one runner replayed as CUDA graphs (see module docstring)."""

    def __init__(
        self,
        step: Callable[[torch.Tensor, AttnContext], torch.Tensor],
        scratch_page: int,
        page_size_tokens: int,
        device: torch.device,
        capture: GraphCapture,
        max_batch: int = GRAPH_BATCHES[-1],
    ) -> None:
        self.step = step
        """Token ids [B, 1] and their context -> float32 logits [B, vocab], eagerly."""
        self.scratch_page, self.page = scratch_page, page_size_tokens
        self.device = device
        self.capture = capture
        self.batches = tuple(b for b in GRAPH_BATCHES if b <= max_batch)
        self.buckets: dict[tuple[int, int], _Bucket] = {}
        self.replays = 0

    def bucket_of(self, batch: int, pages: int) -> tuple[int, int] | None:
        """(batch, pages) of the graph a step of `batch` sequences gathering `pages` pages
        each runs in; None: larger than any graph (eager)."""
        fit = [b for b in self.batches if b >= batch]
        return (fit[0], _pow2_at_least(pages)) if fit else None

    def __call__(self, token_ids: torch.Tensor, ctx: AttnContext) -> torch.Tensor | None:
        batch, pages = ctx.gather_pages.shape
        key = self.bucket_of(batch, pages)
        if key is None or ctx.mask is None or ctx.num_keys is not None:
            return None
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = self._static(*key)
        self._fill(bucket, token_ids, ctx)
        if bucket.step is None:
            log.info("capturing the decode step for batch %d, %d pages", *key)
            # The warm-up and capture run this step's own inputs: writing its K/V twice
            # writes the same values.
            bucket.step = self.capture.capture(lambda: self.step(bucket.ids, bucket.ctx))
        bucket.step.replay()
        self.replays += 1
        return bucket.step.out[:batch].clone()

    def _static(self, batch: int, pages: int) -> _Bucket:
        """A bucket's static inputs, every row on the scratch page (a valid step as is)."""
        d = self.device
        ids = torch.zeros(batch, 1, dtype=torch.int64, device=d)
        ctx = AttnContext(
            cos=torch.empty(0, device=d),  # shaped at the first fill
            sin=torch.empty(0, device=d),
            write_slots=torch.zeros(batch, dtype=torch.int64, device=d),
            valid_index=None,
            gather_pages=torch.zeros(batch, pages, dtype=torch.int64, device=d),
            page_size_tokens=self.page,
            num_keys=None,
            mask=torch.zeros(batch, 1, 1, pages * self.page, dtype=torch.bool, device=d),
        )
        return _Bucket(ids, ctx)

    def _fill(self, bucket: _Bucket, token_ids: torch.Tensor, ctx: AttnContext) -> None:
        """Copy a step's inputs into the bucket's static tensors, padded (in place: the
        graph reads these very tensors)."""
        s, n = bucket.ctx, token_ids.shape[0]
        pages = ctx.gather_pages.shape[1]
        if s.cos.numel() == 0:  # rope tables' dtype and width are the runner's: take them
            pad = (bucket.ids.shape[0], *ctx.cos.shape[1:])
            bucket.ctx = s = replace(
                s,
                cos=torch.ones(pad, dtype=ctx.cos.dtype, device=self.device),
                sin=torch.zeros(pad, dtype=ctx.sin.dtype, device=self.device),
            )
        bucket.ids.zero_()
        bucket.ids[:n].copy_(token_ids)
        s.cos[:n].copy_(ctx.cos)
        s.sin[:n].copy_(ctx.sin)
        s.cos[n:].fill_(1.0)  # position 0
        s.sin[n:].zero_()
        first = self.scratch_page * self.page
        rows = torch.arange(s.write_slots.shape[0], device=self.device)
        s.write_slots.copy_(first + rows % self.page)  # padded rows write the scratch page
        s.write_slots[:n].copy_(ctx.write_slots)
        s.gather_pages.fill_(self.scratch_page)
        s.gather_pages[:n, :pages].copy_(ctx.gather_pages)
        assert s.mask is not None and ctx.mask is not None
        s.mask.zero_()
        s.mask[:n, ..., : pages * self.page].copy_(ctx.mask)
        s.mask[n:, ..., 0] = True  # a padded row attends the scratch page's first slot
