"""`surge::gemv_row`: batch-1 projections through surge's own AVX2 kernel (`csrc/gemv_row.cpp`).

Why: a batch-1 decode step is one-row projections over every weight, memory-bound. MKL's
sgemv on the stored `[in, out]` layout reads 24-27 GB/s with one thread on this project's
VM, where a tensor sum reads ~40 GB/s; the kernel (the output row in cached chunks, eight
weight rows streamed into it at a time) reads 39-41 GB/s on the 100mb preset's shapes.

What flows: `load()` builds the C++ extension once per machine (torch's extension cache,
~15 s the first time, then a file check) and says whether the op can run here: float32 on
a CPU with AVX2 and FMA, a C++ compiler and ninja. The extension registers
`surge::gemv_row(x, wt)` with the dispatcher itself (schema and CPU kernel), so a compiled
decode graph's C++ wrapper calls it without Python; its shape function is registered here.
Who uses it: `Linear.__call__` for every one-row float32 call on CPU, eager or inside a
compiled decode step; `ModelRunner` (and an agent's engine import at start-up) call
`load()`, and `setup.sh` builds it once. Sums run in another order than MKL's: logits differ
in the last bits, as inductor's already do (the engine tests check the tokens against HF's).
"""

import logging
import shutil
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "gemv_row.cpp"
"""The kernel's C++ source (built by torch's extension loader)."""

_built = False
_tried = False
_one_thread = True
"""The kernel is single-threaded: with more intra-op threads MKL's threaded gemv reads faster,
so it is used only while torch runs one thread (looked at on every `load()`)."""


def _cpu_ok() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _gemv_row_fake(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], wt.shape[1]))


def load() -> bool:
    """Build (or find built) the kernel and register `surge::gemv_row` (schema and CPU
    kernel from C++, its shape function here); True when it can run here. A machine without
    AVX2, a compiler or ninja logs why once and keeps MKL."""
    global _built, _tried, _one_thread
    _one_thread = torch.get_num_threads() == 1
    if _tried:
        return _built
    _tried = True
    if not _cpu_ok():
        log.info("gemv_row: this CPU lacks AVX2; one-row projections stay MKL's")
        return False
    if not (shutil.which("ninja") and (shutil.which("c++") or shutil.which("g++"))):
        log.warning("gemv_row: no ninja or C++ compiler; one-row projections stay MKL's")
        return False
    from torch.utils.cpp_extension import load as load_extension

    start = time.perf_counter()
    try:
        load_extension(
            name="surge_gemv_row",
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-mavx2", "-mfma"],
            is_python_module=False,
            verbose=False,
        )
        torch.library.register_fake("surge::gemv_row", _gemv_row_fake)
    except Exception as e:  # a failed build is not fatal: MKL computes the same thing
        log.warning("gemv_row: the kernel did not build (%s); one-row projections stay MKL's", e)
        return False
    _built = True
    log.info("gemv_row: kernel ready in %.1f s", time.perf_counter() - start)
    return True


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x @ weight.T` may go through the kernel: one row, float32 on CPU, the weight
    stored `[in, out]` (its transpose has unit column stride), the kernel built and torch on
    one thread when `load()` last looked."""
    return (
        _built
        and _one_thread
        and x.numel() == x.shape[-1]
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.device.type == "cpu"
        and weight.dim() == 2
        and weight.stride(0) == 1
    )
