"""`Linear`: one projection of the model — a weight view, its bias, and on CPU a packed copy.

Weights arrive as views into block buffers (`surge.model.blocks`), so a layer is usable the
moment its block lands, and the buffer can still be forwarded to peers byte for byte. On CPU,
MKL's row-major sgemm is slow at the small row counts a decoding batch has (2-64 rows): it
repacks the weight on every call. oneDNN can keep a copy of the weight in its blocked layout
(`mkldnn._reorder_linear_weight`) and multiply against it directly; measured on this project's
2-core EPYC VM, one thread, a 100 MB Llama's 43 projections: 24.6 -> 18.8 ms at 8 rows and
42.5 -> 36.0 ms at 32 rows (benchmarks/engine/vs_peers.py for end to end). Calls of up to
`gemv.max_rows()` rows (decode) go to surge's own kernel on the plain view instead
(`engine/gemv.py`), which streams the weight once for all rows; without it, MKL's gemv.

Who owns what: the runner builds a `Linear` per weight when a block lands and, with
`EngineConfig.pack_cpu_weights`, swaps in packed ones a few per batched step
(`BlockWeights.pack_some`); `surge.engine.model` calls it. The packed copy costs a
second copy of the weights' bytes in memory; the block buffer itself is never modified.
Under `torch.compile` (`surge.engine.compiled`) the packed call goes through the opaque
`surge::packed_linear` op, C++ in surge's kernel library (`csrc/packed_linear.cpp`; inductor
lowers oneDNN's op only for weights frozen into the graph); where that library is not built,
a compiled graph's calls of more than `gemv.max_rows()` rows are MKL's `F.linear`.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from surge.engine import gemv

PACK_ROWS_HINT = 8
"""Row count oneDNN picks its blocked layout for: measured best over 2-64 rows here."""


def can_pack(weight: torch.Tensor) -> bool:
    """Packing applies to 2-D float32 CPU weights when this torch has oneDNN."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
    )


@dataclass(frozen=True)
class Linear:
    """y = x W^T + b, with W [out, in] a view of the block buffer."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    packed: torch.Tensor | None = None
    """oneDNN-blocked copy of `weight`, used for calls with 2 or more rows; None: not packed."""

    @staticmethod
    def of(weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = False) -> "Linear":
        """A projection of `weight`; packed when asked for and `can_pack(weight)`."""
        packed = None
        if pack and can_pack(weight):
            # oneDNN reorders a contiguous [out, in] ~10x faster than a transposed view.
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_ROWS_HINT)
        return Linear(weight=weight, bias=bias, packed=packed)

    @property
    def num_bytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def with_packing(self) -> "Linear":
        """This projection with a packed copy (itself when packed already or not packable)."""
        if self.packed is not None or not can_pack(self.weight):
            return self
        return Linear.of(self.weight, self.bias, pack=True)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # surge's kernel first: a decode batch of up to `gemv.max_rows()` rows streams the
        # weight once for all its rows (`engine/gemv.py`), faster than MKL's gemv at one row
        # and oneDNN's packed GEMM at a few. Such graphs then never read `packed`, so
        # packing, swapping it in, does not invalidate them.
        if gemv.usable(x, self.weight):
            y = torch.ops.surge.gemv_row(x, self.weight.t())
            return y if self.bias is None else y + self.bias
        if x.numel() > x.shape[-1] and self.packed is not None:  # two or more rows
            if not torch.compiler.is_compiling():
                return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
            if gemv.loaded():  # oneDNN's op as an opaque C++ call in the graph
                return torch.ops.surge.packed_linear(x, self.packed, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def fuse_linears(parts: Sequence[Linear]) -> Linear:
    """One projection whose output is `parts`' outputs side by side (q|k|v, gate|up): a copy.

    One matrix streams in one call what several did in several: measured on this project's
    VM (one thread, 100mb preset's 6 layers), the layers' projections at one row 5.0 -> 4.3 ms
    with q/k/v and gate/up fused (MKL's per-call overhead on the small k/v matrices, and
    two calls fewer), 1.02-1.08x at 8 rows packed, 1.01-1.03x at 32. The copy keeps the
    parts' layout: stored transposed (`[in, out]` contiguous, read as an `[out, in]` view), the
    fused weight is `[in, sum(out)]` contiguous, so one-row calls stay MKL's column gemv.
    A missing bias among present ones is zeros (adds nothing). Unpacked; pack it afterwards.
    """
    weights = [p.weight for p in parts]
    if all(w.t().is_contiguous() for w in weights):
        weight = torch.cat([w.t() for w in weights], dim=1).t()
    else:
        weight = torch.cat([w.contiguous() for w in weights], dim=0)
    bias = None
    if any(p.bias is not None for p in parts):
        bias = torch.cat(
            [p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0]) for p in parts]
        )
    return Linear(weight=weight, bias=bias)


def split_linear(fused: Linear, sizes: Sequence[int]) -> tuple[Linear, ...]:
    """The parts of a fused projection, `sizes` output rows each, as views of its weight and
    bias (no copy; unpacked): the reverse of `fuse_linears`. Stored transposed, a part is a
    column slice of `[in, sum(out)]`, read with a leading dimension of `sum(out)`, which
    BLAS takes as it is."""
    assert fused.packed is None, "split a projection before packing it"
    weights = fused.weight.split(list(sizes), dim=0)
    biases = fused.bias.split(list(sizes)) if fused.bias is not None else (None,) * len(sizes)
    return tuple(Linear(weight=w, bias=b) for w, b in zip(weights, biases, strict=True))
