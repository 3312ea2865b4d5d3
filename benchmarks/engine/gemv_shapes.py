"""surge's decode kernel (`surge::gemv_row`) against what the engine would call without it,
at a real model's projection shapes, in the order a decode step reads them.

What flows: SmolLM2-135M's projection shapes (the default; hidden 576, q|k|v 960, gate|up
3,072, down 1,536 -> 576, head 49,152; 30 layers) as random float32 weights stored the
engine's way (`[in, out]`), 538 MB a pass: more than the L3, so each pass streams from
memory as a decode step does. Per (thread count, rows): one pass over every weight in step
order, alternating kernel and alternative pass by pass; `--passes` of each, best and median.
The alternative is MKL's gemv (`F.linear`) at one row and oneDNN's packed GEMM (the engine's
`Linear` with `pack_cpu_weights`) at more; MKL's sgemm beside it. Also the best read
bandwidth over a 512 MB tensor (`vs_peers_runs.read_bandwidth_gbps`). Writes
benchmarks/results/engine/gemv_shapes.json and .png. The 1-minute load average is recorded:
run it through `/work/notes/quiet-run --strict` (the 2 cores are shared).

Usage: python -m benchmarks.engine.gemv_shapes [--threads default,1] [--rows 1,2,4,8] [--passes 6]
       [--resume]  (merge the (threads, rows) measured into the result file, keep the others)
"""

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__:  # python -m benchmarks.engine.gemv_shapes
    from benchmarks.engine.vs_peers import merged
    from benchmarks.engine.vs_peers_runs import read_bandwidth_gbps
else:  # python benchmarks/engine/gemv_shapes.py
    from vs_peers import merged  # type: ignore[no-redef]
    from vs_peers_runs import read_bandwidth_gbps  # type: ignore[no-redef]

log = logging.getLogger("gemv_shapes")
RESULTS = Path(__file__).resolve().parents[1] / "results" / "engine"
LAYER_SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))
"""SmolLM2-135M's per-layer projections as stored, `[in, out]`: q|k|v, o, gate|up, down."""
HEAD_SHAPE = (576, 49152)
NUM_LAYERS = 30


def step_weights() -> list[torch.Tensor]:
    """Every projection of a decode step, in step order, as `[out, in]` views of `[in, out]`."""
    shapes = [s for _ in range(NUM_LAYERS) for s in LAYER_SHAPES] + [HEAD_SHAPE]
    return [torch.randn(*s).t() for s in shapes]


def one_pass(fn, weights: list, xs: dict) -> float:
    t = time.perf_counter()
    for w in weights:
        fn(xs[w.shape[1]], w)
    return time.perf_counter() - t


def measure(threads: int, rows: int, passes: int, weights: list) -> dict:
    from surge.engine.linear import Linear

    torch.set_num_threads(threads)
    xs = {k: torch.randn(rows, k) for k in {w.shape[1] for w in weights}}
    ways = {"kernel": lambda x, w: torch.ops.surge.gemv_row(x, w.t())}
    ways["mkl"] = F.linear  # MKL's gemv at one row, its sgemm at more
    packed = {}
    if rows > 1:  # the engine's alternative at 2+ rows: oneDNN's packed copy (as `Linear`
        # calls it above the kernel's rows)
        packed = {id(w): Linear.of(w, pack=True).packed for w in weights}
        ways["onednn_packed"] = lambda x, w: torch.ops.mkldnn._linear_pointwise(
            x, packed[id(w)], None, "none", [], ""
        )
    times: dict[str, list[float]] = {n: [] for n in ways}
    with torch.inference_mode():
        for fn in ways.values():
            one_pass(fn, weights, xs)  # warm: first calls, oneDNN's primitives
        for _ in range(passes):
            for name, fn in ways.items():
                times[name].append(one_pass(fn, weights, xs))
    num_bytes = sum(w.numel() * w.element_size() for w in weights)
    out = {"threads": threads, "rows": rows, "load_1min": os.getloadavg()[0]}
    out["measured_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name, ts in times.items():
        out[name] = {
            "best_ms": round(min(ts) * 1e3, 2),
            "median_ms": round(statistics.median(ts) * 1e3, 2),
            "best_gbps": round(num_bytes / min(ts) / 1e9, 2),
        }
    ref = "onednn_packed" if rows > 1 else "mkl"
    out["alternative"] = ref
    out["alternative_over_kernel_best"] = round(out[ref]["best_ms"] / out["kernel"]["best_ms"], 3)
    out["alternative_over_kernel_median"] = round(
        out[ref]["median_ms"] / out["kernel"]["median_ms"], 3
    )
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ways = ["kernel", "mkl", "onednn_packed"]
    width = 0.8 / len(ways)
    for k, way in enumerate(ways):
        for i, r in enumerate(res):
            if way in r:
                x = i + (k - 1) * width
                ax.bar(x, r[way]["best_gbps"], width, color=f"C{k}", label=way if i == 0 else None)
    for i, r in enumerate(res):
        ax.text(i, 0, f"{r['alternative']}/kernel\n{r['alternative_over_kernel_best']}x",
                ha="center", va="bottom", fontsize=7)  # fmt: skip
    ax.set_xticks(range(len(res)), [f"{r['threads']} thr, {r['rows']} rows" for r in res])
    ax.set_ylabel("GB/s of weights (best pass)")
    ax.set_title("SmolLM2-135M projections in step order (538 MB a pass)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _threads_key(x: dict) -> tuple:
    return (x["threads"],)


def _rows_key(x: dict) -> tuple:
    return (x["threads"], x["rows"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="default,1", help="'default' (torch's) and/or counts")
    ap.add_argument("--rows", default="1,2,4,8", help="input rows per call (a decode batch)")
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--out", type=Path, default=RESULTS / "gemv_shapes.json")
    merge = "merge into --out: replace the (threads, rows) measured now, keep the others"
    ap.add_argument("--resume", action="store_true", help=merge)
    args = ap.parse_args()
    previous = json.loads(args.out.read_text()) if args.resume and args.out.exists() else {}
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    from surge.engine import gemv

    if not gemv.load():
        raise SystemExit("error: surge's kernel is not built here; run ./setup.sh")
    default = torch.get_num_threads()
    threads = [default if t == "default" else int(t) for t in args.threads.split(",")]
    weights = step_weights()
    load_start = os.getloadavg()[0]
    results, read = [], []
    for t in threads:
        torch.set_num_threads(t)
        read.append({"threads": t, "read_gbps": round(read_bandwidth_gbps(), 2)})
        for rows in (int(r) for r in args.rows.split(",")):
            results.append(measure(t, rows, args.passes, weights))
            log.info("%s", json.dumps(results[-1]))
    torch.set_num_threads(default)
    report = {
        "benchmark": "gemv_shapes",
        "machine": {
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "default_threads": default,
            "loadavg_1min_start_end": [load_start, os.getloadavg()[0]],
        },
        "settings": {k: str(v) for k, v in vars(args).items()},
        "bytes_per_pass": sum(w.numel() * w.element_size() for w in weights),
        "read_bandwidth": merged(previous.get("read_bandwidth", []), read, _threads_key),
        "results": merged(previous.get("results", []), results, _rows_key),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
