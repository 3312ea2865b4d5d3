"""`surge::gemv_row`: decode projections of 1-8 rows through surge's kernel (`csrc/gemv_row.cpp`).

Why: a decode step of a small batch is projections of a few rows over every weight,
memory-bound: what counts is how fast the weights stream. The kernel folds eight weight rows
at a time into the output rows, a cached chunk of columns at a time, with AVX-512 where the
CPU has it (else AVX2); for 2-8 input rows every weight vector loaded serves all of them, so
the weight streams once per call (the engine sends it up to `max_rows()`, a measured rule).
It splits the weight's rows over torch's intra-op threads
(`at::parallel_for` over twelve fixed row blocks, partial sums added in block order; the
head's columns; so the sums do not depend on the thread count): each thread streams
contiguous rows, which the prefetchers follow. Built with OpenMP, sharing torch's runtime
(without it `at::parallel_for` runs serially). The engine calls it at every thread count.

What flows: `build()` compiles the C++ extension once per machine and source (~15 s;
`setup.sh` runs it, as does `python -m surge.engine.gemv`) into a cache directory named by
a digest of the source, its flags and torch's version, so every checkout of the same source
shares one build. `load()` only loads that built library (a file check, never a compile, so
an agent never waits at start-up for a build or for another process's build lock) and says
whether the op can run here: float32 on a CPU with AVX2 and FMA, the library built. The
extension registers `surge::gemv_row(x, wt)` with the dispatcher itself (schema and CPU
kernel), so a compiled decode graph's C++ wrapper calls it without Python; its shape
function is registered here. Who uses it: `Linear.__call__` for every float32 call of up
to `max_rows()` rows on CPU, eager or inside a compiled decode step; `ModelRunner` (and an
agent's engine import at start-up) call `load()`. Sums run in another order than MKL's:
logits differ in the last bits, as inductor's already do (the engine tests check the tokens
against HF's).
"""

import hashlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).parent / "csrc" / n
    for n in ("gemv_row.cpp", "decode_attention.cpp", "packed_linear.cpp")
)
"""The C++ sources of surge's CPU kernels, built into one library by torch's extension
loader: `surge::gemv_row`, `surge::decode_attention` (`surge.engine.attention`) and
`surge::packed_linear` (`surge.engine.linear`)."""
CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")
LDFLAGS = ("-fopenmp",)
KERNEL_MAX_ROWS = 8
"""Input rows one kernel call can take (`x` [rows, in]; `kMaxInputRows` in the source)."""
MAX_ROWS = 8
"""Input rows the engine sends through the kernel at two or more threads (a decode batch of
up to 8 streams each weight once for all its rows); more rows go to oneDNN's packed GEMM
(`engine/linear.py`). At one thread, `MAX_ROWS_ONE_THREAD`. Measured rules:
benchmarks/engine/gemv_shapes.py (strict quiet-runs 2026-11-28, SmolLM2's projections in step
order, 538 MB a pass, kernel / oneDNN packed, best ms) at 10:43 UTC: 2 rows 22.1 / 31.1 at 2
threads and 39.9 / 51.4 at one; 4 rows 25.6 / 31.1 and 49.3 / 60.0; 8 rows 40.9 / 39.5 and
65.4 / 60.0; at 11:43: 6 rows 36.5 / 40.0 and 76.6 / 77.3; 7 rows 40.8 / 42.0 and 74.5 /
77.7. End to end at 2 threads (engine_vs_peers, SmolLM2, batch 8) sending 7-8 rows to
oneDNN (its calls then through a Python op) gave 113.1 tok/s (11:33 sitting) against the
kernel's 129.3 (08:31), so the kernel keeps 1-8 rows there."""
MAX_ROWS_ONE_THREAD = 7
"""Kernel rows at one thread: oneDNN's packed GEMM is ahead from 8 rows (above: 65.4 ms
against 60.0 at 8 rows, 74.5 against 77.7 at 7). End to end (strict sitting 17:05 UTC
2026-11-28, SmolLM2, batch 8 x 64 + 64, one thread, surge alone, two runs each, since
`surge::packed_linear` is C++): batch 8 through oneDNN 89.3 / 85.7 tok/s, through the
kernel 80.9 / 85.0."""

STALE_LOCK_S = 600.0
"""A build lock older than this was left by a build that died (a build takes ~15 s):
`build()` removes it rather than wait on it forever (torch's loader would)."""

_built = False
_tried = False
_max_rows = MAX_ROWS


def _cpu_ok() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _gemv_row_fake(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], wt.shape[1]))


def _decode_attention_fake(q: torch.Tensor, *_args) -> torch.Tensor:
    return q.new_empty(q.shape)


def _packed_linear_fake(
    x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def build_name() -> str:
    """The extension's name, unique to this source, these flags and this torch."""
    digest = hashlib.sha256(b"".join(src.read_bytes() for src in SOURCES))
    digest.update(" ".join(CFLAGS + LDFLAGS).encode() + torch.__version__.encode())
    return f"surge_gemv_row_{digest.hexdigest()[:12]}"


def build_dir() -> Path:
    """Where the kernel is built and found (`$XDG_CACHE_HOME` or ~/.cache, surge/kernels)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "surge" / "kernels" / build_name()


def library_path() -> Path:
    return build_dir() / f"{build_name()}.so"


def _can_run() -> bool:
    if not _cpu_ok():
        log.info("gemv_row: this CPU lacks AVX2; one-row projections stay MKL's")
        return False
    return True


def build() -> bool:
    """Compile the kernel unless built already, then `load()` it; True when it runs here. A
    machine without AVX2, a compiler or ninja logs why and keeps MKL."""
    global _tried
    _tried = False  # look again after this build, whatever an earlier `load()` found
    if library_path().exists() or not _can_run():
        return load()
    if not (shutil.which("ninja") and (shutil.which("c++") or shutil.which("g++"))):
        log.warning("gemv_row: no ninja or C++ compiler; one-row projections stay MKL's")
        return False
    from torch.utils.cpp_extension import load as load_extension

    where = build_dir()
    where.mkdir(parents=True, exist_ok=True)
    lock = where / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        log.warning("gemv_row: removing a build lock left by a build that died (%s)", lock)
        lock.unlink(missing_ok=True)
    # The source is compiled from inside the build directory: the build's command line is
    # then the same from every checkout, and ninja does not rebuild when the checkout moves.
    sources = [where / src.name for src in SOURCES]
    for src, copy in zip(SOURCES, sources, strict=True):
        copy.write_bytes(src.read_bytes())
    start = time.perf_counter()
    try:
        load_extension(
            name=build_name(),
            sources=[str(src) for src in sources],
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            build_directory=str(where),
            is_python_module=False,
            verbose=False,
        )
    except Exception as e:  # a failed build is not fatal: MKL computes the same thing
        log.warning("gemv_row: the kernel did not build (%s); one-row projections stay MKL's", e)
        return False
    log.info("gemv_row: kernel built in %.1f s (%s)", time.perf_counter() - start, where)
    return load()


def load() -> bool:
    """Load the built kernel and register `surge::gemv_row`'s shape function; True when it
    can run here. Never compiles: without a build (`build()`, run by setup.sh) one-row
    projections stay MKL's."""
    global _built, _tried, _max_rows
    # Read here, outside any graph (each runner calls this as it starts): a graph traced
    # with one value guards on it, so a later change recompiles rather than misroutes.
    _max_rows = MAX_ROWS_ONE_THREAD if torch.get_num_threads() == 1 else MAX_ROWS
    if _built or _tried:
        return _built
    if not _can_run():
        _tried = True
        return False
    path = library_path()
    if not path.exists():
        log.info("gemv_row: not built (run ./setup.sh); one-row projections stay MKL's")
        _tried = True
        return False
    _tried = True
    start = time.perf_counter()
    try:
        if not hasattr(torch.ops.surge, "gemv_row"):
            torch.ops.load_library(str(path))
        torch.library.register_fake("surge::gemv_row", _gemv_row_fake)
        torch.library.register_fake("surge::decode_attention", _decode_attention_fake)
        torch.library.register_fake("surge::packed_linear", _packed_linear_fake)
    except Exception as e:  # a damaged build is not fatal: MKL computes the same thing
        log.warning("gemv_row: %s did not load (%s); one-row projections stay MKL's", path, e)
        return False
    _built = True
    log.info("gemv_row: kernel loaded in %.2f s", time.perf_counter() - start)
    return True


def max_rows() -> int:
    """Rows the kernel takes in this process: `MAX_ROWS`, or `MAX_ROWS_ONE_THREAD` when torch
    had one thread at the last `load()`."""
    return _max_rows


def loaded() -> bool:
    """Whether surge's CPU kernels are loaded here (`load()` found them built)."""
    return _built


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x @ weight.T` goes through the kernel: 1 to `max_rows()` rows, float32 on
    CPU, the weight stored `[in, out]` (its transpose has unit column stride), the kernel
    loaded. At any thread count: the kernel splits the weight over torch's OpenMP threads
    (idle, 2 threads, SmolLM2's projections: 31.8 GB/s against MKL's gemv 30.2 at one row).
    Nothing here may ask torch for its thread count: under `torch.compile` that breaks the
    graph at every projection (`load()` reads it instead)."""
    return (
        _built
        and x.dim() >= 1
        and 0 < x.numel() <= _max_rows * x.shape[-1]
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.device.type == "cpu"
        and weight.dim() == 2
        and weight.stride(0) == 1
    )


if __name__ == "__main__":  # python -m surge.engine.gemv: build the kernel (setup.sh)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(0 if build() else 1)
