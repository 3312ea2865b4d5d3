"""Calibrate the simulator from this machine and predict `benchmarks/scale_burst.py`.

1. Measures surge's engine (`ModelRunner`, CPU, one thread, as each agent runs) on the
   burst's model shape: whole-model forward time of prefill (tokens) and decode (batch)
   steps, fitted as per-layer linear models (least squares, time / layers). The transport
   rate is the benchmark's cap (token buckets, `--link-gbps` per node).
2. Writes that as a simulator profile (an inline GPU profile with
   `measured_layer_costs_s`, a model file of the burst's shape, an 8-node cluster file)
   and runs `surge.sim` on the burst: K warm instances, 64 requests at t=0, binomial
   multicast with K sources, batch limit 4, modes execute_while_load (λScale pipelines)
   and stop_the_world (load-then-serve). The 8 agents share the machine's 2 cores:
   `SimSettings.shared_cores`. One profile serves both modes and both K.
3. Compares predicted vs measured TTFT p50/p90 (`benchmarks/results/scale_burst*.json`,
   or `--run-real` to run scale_burst first) and writes
   `benchmarks/results/sim_calibration.json`.

Usage: python -m benchmarks.sim_calibrate [--cores 2] [--run-real]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
MEASURED = {1: RESULTS / "scale_burst.json", 2: RESULTS / "scale_burst_k2.json"}
MODES = {"execute_while_load": "pipelines", "stop_the_world": "none"}
TOLERANCE = 0.15


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(intercept), float(slope)


def measure_engine(model_mb: float, blocks: int, reps: int) -> dict:
    """Per-layer prefill/decode linear costs of `ModelRunner` on CPU with one thread."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from benchmarks.scale_burst import model_config
    from surge.config import EngineConfig
    from surge.engine.batch import BatchMeta
    from surge.engine.runner import ModelRunner
    from surge.model.importer import import_checkpoint
    from surge.model.manifest import read_manifest
    from surge.model.tiny import create_tiny_model

    torch.set_num_threads(1)
    cfg = model_config(model_mb, blocks)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        create_tiny_model(tmp / "hf", cfg)
        import_checkpoint(tmp / "hf", tmp / "reg" / "m", num_blocks=blocks, progress=False)
        manifest = read_manifest(tmp / "reg" / "m")
        runner = ModelRunner(manifest, EngineConfig(max_num_seqs=8, max_kv_tokens=2048))
        runner.load_blocks()
    gen = torch.Generator().manual_seed(0)
    next_seq = [0]

    def step(batch: int, q: int, ctx: int = 0) -> float:
        seqs = tuple(range(next_seq[0], next_seq[0] + batch))
        next_seq[0] += batch
        if ctx:
            ids = torch.randint(2, cfg.vocab_size, (batch, ctx), generator=gen)
            runner.forward(ids, BatchMeta(seqs, (0,) * batch, (ctx,) * batch))
        ids = torch.randint(2, cfg.vocab_size, (batch, q), generator=gen)
        t = time.perf_counter()
        runner.forward(ids, BatchMeta(seqs, (ctx,) * batch, (q,) * batch))
        dt = time.perf_counter() - t
        for s in seqs:
            runner.free(s)
        return dt

    for _ in range(5):
        step(4, 8)
    layers = cfg.num_layers
    prefill = []  # (tokens, seconds): batches of the burst's shape (4 x 4..12 tokens)
    for batch, q in ((1, 4), (1, 8), (1, 12), (2, 8), (4, 4), (4, 8), (4, 12), (8, 8)):
        prefill.append((batch * q, statistics.median(step(batch, q) for _ in range(reps))))
    decode = []  # (batch, seconds) at a context of ~12 tokens (prompt + a few outputs)
    for batch in (1, 2, 3, 4, 6, 8):
        decode.append((batch, statistics.median(step(batch, 1, 12) for _ in range(reps))))
    a_p, b_p = fit([t for t, _ in prefill], [s / layers for _, s in prefill])
    a_d, b_d = fit([b for b, _ in decode], [s / layers for _, s in decode])
    return {
        "num_layers": layers,
        "model_bytes": manifest.total_bytes,
        "arch": {
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_heads": cfg.num_heads,
            "num_kv_heads": cfg.num_kv_heads,
            "vocab_size": cfg.vocab_size,
        },
        "prefill_points_s": [[t, round(s, 6)] for t, s in prefill],
        "decode_points_s": [[b, round(s, 6)] for b, s in decode],
        "per_layer_s": {
            "prefill_fixed": a_p,
            "prefill_per_token": b_p,
            "decode_fixed": a_d,
            "decode_per_seq": b_d,
        },
    }


def sim_files(engine: dict, nodes: int, link_gbps: float, where: Path) -> tuple[str, str]:
    """Write the calibrated cluster and model files; return their paths."""
    arch = engine["arch"]
    model = {
        "name": "scale-burst-64mb",
        "num_layers": engine["num_layers"],
        "hidden_size": arch["hidden_size"],
        "intermediate_size": arch["intermediate_size"],
        "num_attention_heads": arch["num_heads"],
        "num_key_value_heads": arch["num_kv_heads"],
        "vocab_size": arch["vocab_size"],
        "context_tokens": 2048,
        "mlp": "gated",
        "dtype_bytes": 4,
    }
    c = engine["per_layer_s"]
    gpu = {
        "name": "cpu-1-thread (measured)",
        "memory_gb": 8,
        "tflops": 0.05,
        "mem_bandwidth_gbs": 10,
        "prefill_efficiency": 1.0,
        "decode_efficiency": 1.0,
        "layer_overhead_s": c["prefill_fixed"],
        "measured_layer_costs_s": [
            c["prefill_fixed"],
            c["prefill_per_token"],
            c["decode_fixed"],
            c["decode_per_seq"],
        ],
    }
    cluster = {
        "source": "scale_burst local cluster (agents on one machine, capped links)",
        "groups": [
            {
                "num_nodes": nodes,
                "gpu": gpu,
                "gpus_per_node": 1,
                "nic_gbps": link_gbps,
                "gpu_nic_gbps": None,
                "intra_gpu_gbps": 100,
                "nvlink": False,
                "pcie_gbps": 100,
                "ssd_gbps": 10,
                "registry_gbps": None,
                "host_memory_gb": 16,
                "disk_gb": 100,
            }
        ],
    }
    (where / "model.json").write_text(json.dumps(model))
    (where / "cluster.json").write_text(json.dumps(cluster))
    return str(where / "cluster.json"), str(where / "model.json")


def burst_trace(requests: int, prompt_len: tuple[int, int], max_tokens: int):
    """The burst of scale_burst: same prompt lengths (same RNG draws), all at t=0."""
    import random

    from surge.traces.request import Trace

    rng = random.Random(0)
    lens = []
    lo, hi = prompt_len
    for _ in range(requests):
        n = rng.randint(lo, hi)
        for _ in range(n):
            rng.randrange(2, 500)
        lens.append(n)
    return Trace(
        "scale-burst",
        np.zeros(requests),
        np.asarray(lens, dtype=np.int64),
        np.full(requests, max_tokens, dtype=np.int64),
    )


def simulate_burst(cluster: str, model: str, real: dict, mode: str, cores: float | None):
    """TTFT p50/p90 of the simulated burst (same percentile rule as scale_burst)."""
    from benchmarks.scale_burst import percentile
    from surge.policy.autoscale import AutoscaleSettings
    from surge.sim.settings import SimSettings
    from surge.sim.simulator import simulate
    from surge.sim.systems import system_config

    k = real["sources"]
    system = replace(
        system_config("lambdascale"),
        name=f"lambdascale-{mode}",
        max_sources=k,
        num_blocks=real["blocks"],
        serve_while_loading=MODES[mode],
        host_cache="none",
        # scale_out starts with the burst (the benchmark calls it at once), to N nodes:
        decision_interval_s=1e-3,
        autoscale=AutoscaleSettings(
            target_outstanding_per_instance=real["requests"] / real["nodes"],
            scale_down_delay_s=60.0,
        ),
    )
    settings = SimSettings(
        cluster=cluster,
        models=(model,),
        system=system.name,
        max_batch=real["max_num_seqs"],
        warm_instances=k,
        shared_cores=cores,
    )
    trace = burst_trace(real["requests"], tuple(real["prompt_len"]), real["max_tokens"])
    res = simulate(trace, settings, system=system)
    ttft = [float(f - a) for f, a in zip(res.first_token_s, res.arrival_s, strict=True)]
    if min(ttft) < 0:
        raise RuntimeError(f"{mode}: some requests never got a first token")
    return {
        "ttft_p50_s": round(percentile(ttft, 0.5), 4),
        "ttft_p90_s": round(percentile(ttft, 0.9), 4),
        "all_requests_done_s": round(float(res.done_s.max()), 4),
        "pipelines_opened": sum(1 for e in res.scale_events if e[2] == "pipeline"),
    }


def diagnostics(engine: dict, real: dict, meas: dict) -> dict:
    """What the error comes from: serving speed of the hot sources and transport time,
    measured in the real run vs what the calibrated profile says."""
    c, n = engine["per_layer_s"], engine["num_layers"]
    batch, out = real["max_num_seqs"], real["max_tokens"]
    tokens = batch * sum(real["prompt_len"]) / 2
    batch_s = n * (c["prefill_fixed"] + c["prefill_per_token"] * tokens)
    batch_s += (out - 1) * n * (c["decode_fixed"] + c["decode_per_seq"] * batch)
    first_open = min(t for _, t, _ in meas["endpoints_opened"])
    before = [v for t, v in meas["tokens_per_s_timeline"] if t + 0.25 <= first_open]
    copy_s = real["model_bytes"] * 8 / (real["link_gbps"] * 1e9)
    return {
        "sources_tokens_per_s_measured": round(statistics.mean(before), 1) if before else None,
        "sources_tokens_per_s_profile": round(real["sources"] * batch * out / batch_s, 1),
        "multicast_complete_s_measured": round(meas["multicast_complete_s"], 3),
        "one_full_copy_at_cap_s": round(copy_s, 3),
        "first_endpoint_opened_s_measured": first_open,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cores", type=float, default=2, help="cores the agents share")
    ap.add_argument("--model-mb", type=float, default=64, help="as scale_burst --model-mb")
    ap.add_argument("--reps", type=int, default=9, help="timings per engine point (median)")
    ap.add_argument("--run-real", action="store_true", help="run scale_burst (K=1, K=2) first")
    ap.add_argument("--json", type=Path, default=RESULTS / "sim_calibration.json")
    args = ap.parse_args()
    if args.run_real:
        for k, path in MEASURED.items():
            cmd = [sys.executable, "-m", "benchmarks.scale_burst", "--sources", str(k)]
            subprocess.run([*cmd, "--json", str(path)], check=True)
    reals = {k: json.loads(p.read_text()) for k, p in MEASURED.items()}
    first = reals[1]
    engine = measure_engine(args.model_mb, first["blocks"], args.reps)
    if abs(engine["model_bytes"] - first["model_bytes"]) > 1e-3 * first["model_bytes"]:
        raise SystemExit("error: measured model size differs from the benchmark's")
    report: dict = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "engine": engine,
        "transport_gbps_per_node": first["link_gbps"],
        "shared_cores": args.cores,
        "tolerance": TOLERANCE,
        "scenarios": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        cluster, model = sim_files(engine, first["nodes"], first["link_gbps"], Path(tmp))
        for k, real in reals.items():
            for mode in MODES:
                meas = real["modes"][mode]
                row: dict = {"measured": {q: meas[q] for q in ("ttft_p50_s", "ttft_p90_s")}}
                for label, cores in (("predicted", args.cores), ("predicted_no_sharing", None)):
                    row[label] = simulate_burst(cluster, model, real, mode, cores)
                for q in ("ttft_p50_s", "ttft_p90_s"):
                    err = row["predicted"][q] / meas[q] - 1
                    row.setdefault("relative_error", {})[q] = round(err, 4)
                row["within_tolerance"] = all(
                    abs(e) <= TOLERANCE for e in row["relative_error"].values()
                )
                row["diagnostics"] = diagnostics(engine, real, meas)
                report["scenarios"][f"K={k}/{mode}"] = row
                print(f"K={k} {mode}: {json.dumps(row)}")
    errs = [abs(e) for r in report["scenarios"].values() for e in r["relative_error"].values()]
    report["max_abs_relative_error"] = round(max(errs), 4)
    report["all_within_tolerance"] = all(
        r["within_tolerance"] for r in report["scenarios"].values()
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(
        json.dumps(
            {k: v for k, v in report.items() if k != "engine"} | {"engine": engine["per_layer_s"]},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
