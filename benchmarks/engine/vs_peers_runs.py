"""The measuring side of benchmarks/engine/vs_peers.py: `Worker`, the handle of one engine
process (benchmarks/engine/workers.py, kept alive for the whole run and asked for one
measurement at a time), and the same-run bandwidth probes the report compares decode with
(`read_bandwidth_gbps`: the memory-bandwidth limit; `one_row_projection_gbps`: what one-row
projections reach over the engine's own weights, `projection_weights`).

What flows: a `Worker` gets one JSON request line (batch, prompt length, new tokens) and
returns the worker's one JSON result line as a dict; the probes return GB/s.
"""

import json
import os
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
WORKERS = HERE.parent / "workers.py"


class Worker:
    def __init__(
        self,
        name: str,
        python: str,
        model_dir: Path,
        vocab: int,
        threads: int | None,
        dtype: str,
        max_len: int = 1024,
    ) -> None:
        """`threads` None: the engine's default thread count (torch's: the machine's cores)."""
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.pop(var, None)
            if threads is not None:
                env[var] = str(threads)
        if name == "vllm":
            env.pop("PYTHONPATH")
            # In-process engine core (its worker processes die silently here) and a KV cache
            # that fits beside the others (its default takes GiBs).
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            # Its own thread binding would take every core; OMP_NUM_THREADS decides instead.
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        cmd = [python, str(WORKERS), "--worker", name, "--model-dir", str(model_dir)]
        cmd += ["--vocab", str(vocab), "--dtype", dtype, "--max-len", str(max_len)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )
        self._ready = False

    def wait_ready(self) -> None:
        """Block until the engine has loaded (and compiled): workers start side by side,
        their start-up (vLLM's compile, surge's graphs) never timed."""
        if not self._ready:
            self._expect("READY")
            self._ready = True

    def _expect(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        raise RuntimeError(f"{self.name} worker exited (rc {self.proc.wait()})")

    def measure(self, batch: int, prompt_len: int, new_tokens: int, seed: int) -> dict:
        self.wait_ready()
        assert self.proc.stdin is not None
        req = {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "seed": seed}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._expect("RESULT "))

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def read_bandwidth_gbps(num_bytes: int = 512 << 20, repeats: int = 5) -> float:
    """Best read bandwidth over a tensor far larger than the caches (GB/s): the faster of
    torch's sum and MKL's gemv (`torch.mv` over it as rows of 1,024 floats). The sum alone
    read ~0.65x of what the gemv did on this host (Xeon, 300 MB L3; 1 thread 13.8 against
    20.9 GB/s under load), so a decode step made of gemvs read "over 100%" of its limit."""
    import torch

    x = torch.ones(num_bytes // 4)
    rows = x.view(-1, 1024)
    v = torch.ones(1024)
    best = float("inf")
    for probe in (x.sum, lambda: torch.mv(rows, v)):
        probe()
        for _ in range(repeats):
            t = time.perf_counter()
            probe()
            best = min(best, time.perf_counter() - t)
    return num_bytes / best / 1e9


def projection_weights(store: Path, fuse: bool) -> list:
    """Every projection weight of the checkpoint in `store`, as the engine holds them (q/k/v
    and gate/up fused or not, `EngineConfig.fuse_projections`)."""
    from surge.config import EngineConfig
    from surge.engine.runner import ModelRunner
    from surge.model.manifest import read_manifest

    config = EngineConfig(fuse_projections=fuse, compile_decode=False)
    runner = ModelRunner(read_manifest(store), config)
    runner.load_blocks()
    while runner.weights.fuse_queue:  # what the engine does over its first steps
        runner.weights.fuse_some()
    return [runner.weights.head.lm_head.weight] + [
        getattr(layer, name).weight
        for layer in runner.weights.layers.values()
        for name in layer.projection_names
    ]


def one_row_projection_gbps(weights: list, repeats: int = 5, kernel: bool = False) -> float:
    """Best bandwidth of every projection at one row (F.linear: MKL gemv, what eager
    batch-1 decode calls; `kernel`: surge's `surge::gemv_row`, what a compiled batch-1 step
    calls), over the real weights: the kernel's ceiling in this run."""
    import torch
    import torch.nn.functional as F

    xs = [torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights]
    num_bytes = sum(w.numel() * w.element_size() for w in weights)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            t = time.perf_counter()
            for x, w in zip(xs, weights, strict=True):
                if kernel:
                    torch.ops.surge.gemv_row(x, w.t())
                else:
                    F.linear(x, w)
            best = min(best, time.perf_counter() - t)
    return num_bytes / best / 1e9
