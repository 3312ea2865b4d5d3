"""Which dtype a GGUF import should dequantize to here: float32 or bfloat16, same process.

The real default model (SmolLM2-135M-Instruct Q4_1, `surge.model.default_store`) imported
twice (`surge model import --dtype`), one engine each, default settings and threads, as
`surge serve` runs them. Alternating the engines round by round, per round: a 128-token
prefill, then `--decode` batch-1 greedy decode steps (ms per step), then a batch-8 decode
(ms per step). Reported: the median of the rounds per dtype and bf16/fp32 ratios (> 1: fp32
is faster). Also whether the two give the same greedy tokens. Writes
benchmarks/results/engine/gguf_dtype.json and .png.

`--threads N` sets torch's threads (default: torch's own, as users run it); on a shared VM
whose cores are busy, one thread avoids OpenMP's spinning between threads, which slowed a
2-thread matmul here ~100x at load 17 (the result says which was used).

Usage: python -m benchmarks.engine.gguf_dtype [--rounds 5] [--decode 32] [--threads N]
"""

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.model.default_store import real_model_gguf
from surge.model.gguf import import_gguf
from surge.model.manifest import read_manifest

log = logging.getLogger("gguf_dtype")
RESULTS = Path(__file__).resolve().parents[1] / "results" / "engine"
DTYPES = ("float32", "bfloat16")
PREFILL = [504, 3575, 282, 4649, 314, 7042, 30, 198] * 16  # 128 tokens of real text


def _time_s(engine: LLMEngine, prompts: list[list[int]], steps: int) -> tuple[float, list]:
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    return time.perf_counter() - start, out


def one_round(engine: LLMEngine, decode: int) -> dict[str, float]:
    prefill_s, _ = _time_s(engine, [PREFILL], 1)
    total_s, out = _time_s(engine, [PREFILL[:16]], decode + 1)
    first_s, _ = _time_s(engine, [PREFILL[:16]], 1)
    batch_s, _ = _time_s(engine, [PREFILL[i : i + 16] for i in range(8)], decode + 1)
    batch_first_s, _ = _time_s(engine, [PREFILL[i : i + 16] for i in range(8)], 1)
    return {
        "prefill_128_ms": prefill_s * 1e3,
        "decode_b1_ms_per_step": (total_s - first_s) / decode * 1e3,
        "decode_b8_ms_per_step": (batch_s - batch_first_s) / decode * 1e3,
        "tokens": out[0].token_ids,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    gguf = real_model_gguf()
    if not gguf.is_file():
        raise SystemExit(f"error: {gguf} is absent; run ./setup.sh (it fetches SmolLM2)")
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        for dtype in DTYPES:
            store = Path(tmp) / dtype
            import_gguf(gguf, store, progress=False, dtype=dtype)
            engines[dtype] = LLMEngine(read_manifest(store), EngineConfig())
        rounds: dict[str, list[dict]] = {d: [] for d in DTYPES}
        for r in range(args.rounds):
            for dtype in DTYPES if r % 2 == 0 else DTYPES[::-1]:
                rounds[dtype].append(one_round(engines[dtype], args.decode))
                log.info("round %d %s %s", r, dtype, {k: v for k, v in rounds[dtype][-1].items()
                                                      if k != "tokens"})  # fmt: skip
    keys = ("prefill_128_ms", "decode_b1_ms_per_step", "decode_b8_ms_per_step")
    median = {d: {k: statistics.median(x[k] for x in rounds[d]) for k in keys} for d in DTYPES}
    result = {
        "benchmark": "gguf_dtype",
        "model": gguf.name,
        "conditions": {
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "load_average_at_end": os.getloadavg(),
            "rounds": args.rounds,
            "decode_steps": args.decode,
            "note": "medians of rounds, engines alternating in one process; a shared 2-core VM",
        },
        "median": median,
        "bf16_over_fp32": {k: median["bfloat16"][k] / median["float32"][k] for k in keys},
        "same_greedy_tokens": rounds["float32"][0]["tokens"] == rounds["bfloat16"][0]["tokens"],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gguf_dtype.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, RESULTS / "gguf_dtype.png")
    log.info("%s", json.dumps(result, indent=1))


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(result["bf16_over_fp32"])
    fig, axes = plt.subplots(1, len(keys), figsize=(10, 3.2))
    for ax, key in zip(axes, keys, strict=True):
        vals = [result["median"][d][key] for d in DTYPES]
        ax.bar(["fp32", "bf16"], vals, color=["tab:blue", "tab:orange"])
        ax.set_title(f"{key}\nbf16/fp32 = {result['bf16_over_fp32'][key]:.2f}", fontsize=9)
        ax.set_ylabel("ms")
    fig.suptitle(f"GGUF import dtype, {result['model']} (CPU, medians)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
