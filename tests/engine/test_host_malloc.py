"""`keep_freed_host_memory`: once a step's intermediates (a few MB to 32 MB) have been
allocated, the next steps get them back from glibc's heap without page faults. By default
glibc unmaps or trims them, and an eager prefill faulted its intermediates in anew every step
(SmolLM2, 2,000 tokens: 485,000 faults a prefill; docs/engine.md)."""

import platform
import subprocess
import sys

import pytest

SIZES_MB = (5, 9, 14, 20, 24, 30)
ROUNDS = f"""
import resource, torch
from surge.engine.host_malloc import keep_freed_host_memory
assert keep_freed_host_memory() and keep_freed_host_memory()  # idempotent
def step():  # a prefill step's intermediates: allocated, written, freed
    ts = [torch.ones(n << 20, dtype=torch.uint8) for n in {SIZES_MB}]
    del ts
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_freed_intermediates_come_back_without_page_faults() -> None:
    cmd = [sys.executable, "-c", ROUNDS]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    faults = [int(f) for f in out.stdout.split()]
    pages = sum(SIZES_MB) * 256  # 4 KB pages one step allocates
    assert faults[0] > pages // 2  # the first step's pages are new
    # A few steps in, glibc has the chunks in its heap: (almost) nothing faults any more.
    assert sum(faults[4:]) < pages // 10, faults
