"""What storing q|k|v and gate|up fused (store version 3) changes in the engine, same process.

Three engines over one random-weight checkpoint (`--preset`), imported twice: as a version-3
store (q|k|v, gate|up stored fused) and in the separate layout of older stores:

    stored-fused   version-3 store, fuse_projections on: fused views of the block buffer
    runtime-fused  separate store, fuse_projections on: fused by copies in the first steps
                   (what every store got before version 3)
    split-views    version-3 store, fuse_projections off: q/k/v/gate/up as column views

Reported, alternating the engines round by round (one thread, medians of rounds):
- first steps: a fresh runner's first `--first-steps` batch-1 decode steps right after its
  blocks landed (what a scale-out's new instance runs first: runtime-fused copies a layer's
  projections per step there), and the bytes copied for fusing;
- settled decode: ms per decode step at `--batches` once fusing and packing are done.
Writes benchmarks/results/engine/fused_store_decode.json.

Usage: python -m benchmarks.engine.fused_store_decode [--preset 100mb] [--batches 1,8] [--rounds 7]
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
from surge.engine.batch import BatchMeta
from surge.engine.runner import ModelRunner
from surge.model.importer import import_checkpoint
from surge.model.manifest import Manifest, read_manifest
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import preset

log = logging.getLogger("fused_store_decode")
RESULTS = Path(__file__).resolve().parents[1] / "results" / "engine"
ENGINES = {
    "stored-fused": ("fused", True),
    "runtime-fused": ("separate", True),
    "split-views": ("fused", False),
}
"""Engine -> (store layout, EngineConfig.fuse_projections)."""
PROMPT_LEN = 32


def fresh_runner(manifest: Manifest, fuse: bool) -> ModelRunner:
    runner = ModelRunner(manifest, EngineConfig(fuse_projections=fuse, max_kv_tokens=8192))
    runner.load_blocks()
    return runner


def prefill(runner: ModelRunner, batch: int, vocab: int) -> list[int]:
    """`batch` sequences of PROMPT_LEN tokens, one prefill step each; their last tokens."""
    last = []
    for s in range(batch):
        tokens = torch.randint(
            2, vocab, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(s)
        )
        meta = BatchMeta(seq_ids=(s,), q_lens=(PROMPT_LEN,), ctx_lens=(0,))
        last.append(int(runner.forward(tokens, meta).argmax(-1)))
    return last


def decode(runner: ModelRunner, last: list[int], steps: int) -> tuple[list[float], list[int]]:
    """`steps` greedy decode steps of every sequence together: seconds per step, tokens."""
    batch, times, out = len(last), [], []
    for i in range(steps):
        meta = BatchMeta(
            seq_ids=tuple(range(batch)),
            q_lens=(1,) * batch,
            ctx_lens=(PROMPT_LEN + i,) * batch,
        )
        t = time.perf_counter()
        logits = runner.forward(torch.tensor(last).view(batch, 1), meta)
        times.append(time.perf_counter() - t)
        last = logits.argmax(-1).tolist()
        out.append(last[0])
    return times, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="100mb")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=32, help="settled decode steps per measurement")
    ap.add_argument("--first-steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=RESULTS / "fused_store_decode.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    cfg = preset(args.preset)
    batches = [int(b) for b in args.batches.split(",")]
    load_start = os.getloadavg()[0]
    first: dict[str, list[float]] = {e: [] for e in ENGINES}
    settled: dict[str, dict[int, list[float]]] = {e: {b: [] for b in batches} for e in ENGINES}
    copied: dict[str, int] = {}
    tokens: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        create_tiny_model(Path(tmp) / "hf", cfg)
        stores = {}
        for layout in ("fused", "separate"):
            import_checkpoint(
                Path(tmp) / "hf",
                Path(tmp) / layout,
                progress=False,
                fuse_projections=layout == "fused",
            )
            stores[layout] = read_manifest(Path(tmp) / layout)
        settled_runners = {}
        for e, (layout, fuse) in ENGINES.items():
            r = settled_runners[e] = fresh_runner(stores[layout], fuse)
            while r.weights.fuse_queue:
                r.weights.fuse_some()
            while r.weights.pack_queue:
                r.weights.pack_some()
        names = list(ENGINES)
        for rnd in range(args.rounds):
            for e in names[rnd % 3 :] + names[: rnd % 3]:
                layout, fuse = ENGINES[e]
                # A fresh instance: blocks just landed, first steps at batch 1.
                r = fresh_runner(stores[layout], fuse)
                copied[e] = sum(
                    r.weights.layers[layer].fusable_bytes for layer in r.weights.fuse_queue
                )
                last = prefill(r, 1, cfg.vocab_size)
                times, out = decode(r, last, args.first_steps)
                first[e].append(sum(times))
                tokens[e] = out
                del r
                r = settled_runners[e]
                for b in batches:
                    last = prefill(r, b, cfg.vocab_size)
                    times, _ = decode(r, last, args.steps)
                    settled[e][b].append(statistics.median(times))
                    for s in range(b):
                        r.free(s)
            log.info(
                "round %d: first %d steps %s",
                rnd,
                args.first_steps,
                ", ".join(f"{e} {first[e][-1] * 1e3:.1f} ms" for e in names),
            )
    base = "runtime-fused"
    report = {
        "benchmark": "fused_store_decode",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": 1,
            "note": "2 cores shared with other work: compare ratios within this run",
            "loadavg_1min_start_end": [load_start, os.getloadavg()[0]],
        },
        "settings": vars(args) | {"out": str(args.out), "prompt_len": PROMPT_LEN},
        "engines": {e: {"store": s, "fuse_projections": f} for e, (s, f) in ENGINES.items()},
        "same_greedy_tokens": all(t == tokens[base] for t in tokens.values()),
        "fusing_bytes_copied_at_landing": copied,
        "first_steps_ms_median": {
            e: round(statistics.median(v) * 1e3, 2) for e, v in first.items()
        },
        "first_steps_ms_rounds": {e: [round(x * 1e3, 2) for x in v] for e, v in first.items()},
        "settled_step_ms_median": {
            e: {str(b): round(statistics.median(v) * 1e3, 3) for b, v in per.items()}
            for e, per in settled.items()
        },
    }
    report["first_steps_over_runtime_fused"] = {
        e: round(statistics.median(first[e]) / statistics.median(first[base]), 3) for e in ENGINES
    }
    report["settled_step_over_runtime_fused"] = {
        e: {
            str(b): round(statistics.median(settled[e][b]) / statistics.median(settled[base][b]), 3)
            for b in batches
        }
        for e in ENGINES
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if "rounds" not in k}, indent=1))


if __name__ == "__main__":
    main()
