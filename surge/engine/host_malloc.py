"""`keep_freed_host_memory`: glibc's malloc keeps a prefill's freed intermediates for the next
step instead of handing them back to the kernel.

Why: an eager prefill allocates every intermediate fresh (q|k|v, gate|up, SiLU, products,
norms, rope: ~66 MB a layer for SmolLM2 at 2,000 tokens) and frees it a few ops later.
glibc serves allocations over its mmap threshold (128 KB at start, raised only up to the
largest chunk freed so far) with `mmap` and returns them with `munmap`, and trims the top of
its heap whenever more than twice that is free, so the next op's tensor comes back as new
pages the kernel must fault in and zero, one 4 KB page at a time. Measured on this project's
VM (SmolLM2, a 2,000-token prompt, torch's 2 threads): 485,000 page faults per prefill (1.9 GB
of fresh pages); with the thresholds below, 750 from the second prompt on, and ~15% less CPU
(benchmarks/engine/vs_peers.py for end to end).

What changes: `mallopt(M_MMAP_THRESHOLD, 32 MiB)` (glibc's largest; fixing it also stops the
dynamic adjustment) and `mallopt(M_TRIM_THRESHOLD, 512 MiB)`: chunks up to 32 MiB come from
the heap, and up to 512 MiB of freed heap stays mapped for reuse. Larger allocations (model
blocks, the KV cache, a step's intermediates above 32 MiB) are still mapped and unmapped on
their own, so dropping a model still gives its memory back. Process-wide and idempotent;
called by `ModelRunner` on the CPU. Without glibc (musl, macOS) nothing changes.
"""

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""`mallopt` parameter numbers (glibc's malloc.h)."""
MMAP_THRESHOLD_BYTES = 32 << 20
"""glibc's largest mmap threshold on 64-bit (`DEFAULT_MMAP_THRESHOLD_MAX`)."""
TRIM_THRESHOLD_BYTES = 512 << 20
"""Freed heap kept mapped before glibc trims it: room for several layers' intermediates of a
long prefill (SmolLM2: ~66 MB a layer at 2,000 tokens)."""

_done = False


def keep_freed_host_memory() -> bool:
    """Set glibc's thresholds once per process; False where malloc is not glibc's (or it
    refused them: nothing changed)."""
    global _done
    if _done:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = ok and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not ok:
        log.warning("glibc refused the malloc thresholds; prefill intermediates fault anew")
        return False
    _done = True
    return True
