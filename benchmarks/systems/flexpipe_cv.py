"""FlexPipe under load variability: Gamma arrivals of CV 1, 2, 4, 8 at the same mean rate.

Four variants compared in the same run (paper 003 §9):
- `flexpipe`: the `flexpipe` strategy, the granularity loop free to split and merge;
- `static-fine`: the same strategy held at `--fine-stages` stages (one granularity);
- `static-coarse`: the same strategy held at one stage per pipeline (each node a full copy;
  more pipelines only by autoscaling);
- `load-then-serve`: the `serverlessllm` strategy (local instances load, then serve).
Two bodies:
1. the runtime (`surge serve`'s controller in process, loopback agents, a tiny Llama built
   here): per variant a fresh cluster, then one phase per CV (arrivals for `--duration` s,
   drained, then `--gap` s idle). Per phase: p50/p99 end-to-end latency, p50/p99 queue time
   (arrival until an endpoint took the request, polled every 10 ms), p50/p99 TTFT, goodput
   (requests meeting `--slo-e2e` per second of the phase), GPU-seconds (slots held x time,
   sampled every 50 ms), the slots always held (10th percentile) and the peak, and the
   refactorings by direction. The static variants hold the system's one set of FlexPipe
   settings (`SystemConfig.flexpipe`, read by the controller and the scale-out) at one
   granularity;
2. the simulator at the paper's scale (`benchmarks/systems/flexpipe_sim.py`: the `flexpipe`
   cluster profile of §9, 82 GPUs, `--sim-rate` 20 QPS, CV 1/2/4/8; static variants at
   every stage count flexpipe chooses among), the first model also with a 0.1-ms stage
   hop, and the ratios again for `--sim-extra-seeds` trace seeds; with `phased` in
   `--sim-workloads`, the first model again on phases alternating CV 1 and the CV
   (`--sim-phase-s`; §3.3 Fig. 1, §9 Fig. 9a), every seed, both hops. Everywhere also
   §9's static baselines provisioned once for the peak (`provisioned-1/2/4/8`: a fixed
   group count, the same shape's autoscaled peak on the trace, held throughout) and the
   same fixed statics at flexpipe's GPU-seconds (`isocost-1/2/4/8`).
Ratios per CV: the best static shape's p99 over flexpipe's (> 1: flexpipe better), and
flexpipe's GPU-seconds over that shape's (`flexpipe_ratios.ratios`; also against
static-coarse alone and the earlier best-of-fine-and-coarse; against the provisioned
statics: the one with the lowest p99 and the coarse one; against the statics at flexpipe's
cost: the one with the lowest p99).

Usage: python -m benchmarks.systems.flexpipe_cv --json benchmarks/results/systems/flexpipe_cv.json \
           --png benchmarks/results/systems/flexpipe_cv.png
       (--skip-sim / --skip-runtime; short: --duration 6 --cvs 1,4 --sim-duration 120)
"""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.common import model_config
from benchmarks.systems.flexpipe_cv_plot import draw
from benchmarks.systems.flexpipe_sim import (
    VARIANTS,
    WORKLOADS,
    run_all,
)
from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.model.importer import import_checkpoint
from surge.model.tiny import create_tiny_model
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.systems import SYSTEMS
from surge.runtime.migration.refactor import FlexPipeline
from surge.sim.settings import Slo
from surge.traces.gamma import gamma_arrivals

MODEL = "fpcv"


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def _settings(variant: str, args: argparse.Namespace) -> FlexPipeSettings:
    base = {"cv_window_s": args.cv_window, "decision_interval_s": 0.5}
    if variant == "static-fine":
        return FlexPipeSettings(stage_counts=(args.fine_stages,), cv_targets=(0.0,), **base)
    if variant == "static-coarse":
        return FlexPipeSettings(stage_counts=(1,), cv_targets=(0.0,), **base)
    return FlexPipeSettings(**base)


async def _phase(ctl, dep, args, cv: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    arrivals = gamma_arrivals(rng, args.rate, cv, args.duration)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    prompts = [list(rng.integers(1, 500, size=args.prompt_tokens)) for _ in arrivals]
    reqs, taken = [], {}
    held: list[int] = []
    start = time.monotonic()
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            held.append(len(dep.instances))
            for r in reqs:
                if id(r) not in taken and r.endpoint is not None:
                    taken[id(r)] = time.monotonic()
            await asyncio.sleep(0.01)

    watcher = asyncio.ensure_future(watch())
    for at, prompt in zip(arrivals, prompts, strict=True):
        await asyncio.sleep(max(0.0, start + float(at) - time.monotonic()))
        reqs.append(await ctl.submit(dep, [int(x) for x in prompt], params))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs)), args.drain)
    end = time.monotonic()
    stop.set()
    await watcher
    done = [r for r in reqs if r.done_t is not None and r.error is None]
    e2e = [r.done_t - r.arrival_t for r in done]
    ttft = [r.first_token_t - r.arrival_t for r in done if r.first_token_t is not None]
    queue = [taken[id(r)] - r.arrival_t for r in reqs if id(r) in taken]
    slots = np.array(held or [0])
    return {
        "requests": len(reqs),
        "finished": len(done),
        "e2e_p50_s": _pct(e2e, 50),
        "e2e_p99_s": _pct(e2e, 99),
        "queue_p50_s": _pct(queue, 50),
        "queue_p99_s": _pct(queue, 99),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p99_s": _pct(ttft, 99),
        "goodput_rps": sum(x <= args.slo_e2e for x in e2e) / (end - start),
        "gpu_seconds": float(slots.mean() * (end - start)),
        "slots_peak": int(slots.max()),
        "slots_always_held": float(np.percentile(slots, 10)),
    }


async def _variant(variant: str, store: Path, state: Path, args: argparse.Namespace) -> dict:
    # One set of FlexPipe settings, read by the controller and the scale-out alike
    # (`SystemConfig.flexpipe`): the static variants hold the system at one granularity.
    original = SYSTEMS["flexpipe"]
    SYSTEMS["flexpipe"] = replace(original, flexpipe=_settings(variant, args))
    cfg = ControllerConfig(state_dir=state, nodes=args.nodes, max_num_seqs=args.max_num_seqs)
    ctl = Controller(cfg)
    await ctl.start()
    out: dict = {}
    try:
        strategy = "serverlessllm" if variant == "load-then-serve" else "flexpipe"
        body = {
            "name": MODEL,
            "model": str(store),
            "strategy": strategy,
            "autoscaling": {
                "min_replicas": 1,
                "max_replicas": args.nodes,
                "target_ongoing_requests": args.target_ongoing,
                "downscale_delay_s": 3,
                "keep_alive_s": 60,
            },
        }
        dep = await ctl.create(body)
        deadline = time.monotonic() + 120
        while not dep.server.endpoints and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for i, cv in enumerate(args.cvs):
            before = dict(dep.flexpipe.refactors) if dep.flexpipe else {}
            row = await _phase(ctl, dep, args, cv, seed=100 + i)
            after = dict(dep.flexpipe.refactors) if dep.flexpipe else {}
            row["refactors"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            row["stages_after"] = [
                len(e.stages) for e in dep.server.endpoints.values() if isinstance(e, FlexPipeline)
            ]
            out[str(cv)] = row
            logging.info("%s cv=%s: %s", variant, cv, row)
            await asyncio.sleep(args.gap)
    finally:
        await ctl.stop()
        SYSTEMS["flexpipe"] = original
    return out


def _ratios(by_variant: dict, cvs: list[str], p99_key: str, gpu_key: str) -> dict:
    out = {}
    for cv in cvs:
        fp = by_variant["flexpipe"][cv]
        statics = [by_variant[v][cv] for v in ("static-fine", "static-coarse")]
        best_p99 = min(s[p99_key] for s in statics if s[p99_key] is not None)
        best_gpu = min(s[gpu_key] for s in statics)
        out[cv] = {
            "best_static_over_flexpipe_e2e_p99": best_p99 / fp[p99_key] if fp[p99_key] else None,
            "flexpipe_over_best_static_gpu_seconds": fp[gpu_key] / best_gpu if best_gpu else None,
        }
    return out


def runtime(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        create_tiny_model(tmp / "hf", model_config(args.model_mb, args.layers))
        store = tmp / "store" / MODEL
        import_checkpoint(tmp / "hf", store, num_blocks=args.layers, progress=False)
        by_variant = {}
        for v in VARIANTS:
            by_variant[v] = asyncio.run(_variant(v, store, tmp / f"state-{v}", args))
    cvs = [str(c) for c in args.cvs]
    return {
        "by_variant": by_variant,
        "ratios": _ratios(by_variant, cvs, "e2e_p99_s", "gpu_seconds"),
    }


def _seed_ratios(
    args: argparse.Namespace, sim_kw: dict, seeds: list[int], known: dict | None = None
) -> dict:
    """{seed: {hop: {cv: flexpipe's ratios and refactorings}}} of the first model for
    `seeds` (how much the seed-1 tables move with the trace). `known`: {(seed, hop): rows}
    already run (not run again)."""
    hops = [None] + ([args.sim_hop_sensitivity_s] if args.sim_hop_sensitivity_s > 0 else [])
    out: dict = {}
    for seed in seeds:
        kw = {**sim_kw, "seed": seed}
        for hop in hops:
            rows = (known or {}).get((seed, hop)) or run_all(
                args.sim_cvs,
                model=args.sim_models[0],
                stage_hop_s=hop,
                provisioned=True,
                **kw,
            )
            key = "system" if hop is None else f"{hop * 1e3:g}ms"
            out.setdefault(str(seed), {})[key] = {
                cv: {
                    **row["ratios"],
                    "refactors": row["flexpipe"]["refactors"],
                    "flexpipe_e2e_p50_s": row["flexpipe"]["e2e_p50_s"],
                    "flexpipe_e2e_p99_s": row["flexpipe"]["e2e_p99_s"],
                }
                for cv, row in rows.items()
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--model-mb", type=float, default=8.0)
    ap.add_argument("--rate", type=float, default=2.0, help="mean arrivals per second")
    ap.add_argument("--cvs", type=lambda s: [float(x) for x in s.split(",")], default=[1, 2, 4, 8])
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of arrivals per CV")
    ap.add_argument("--drain", type=float, default=60.0)
    ap.add_argument("--gap", type=float, default=4.0, help="idle seconds between phases")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=24)
    ap.add_argument("--max-num-seqs", type=int, default=4, help="sequences per engine")
    ap.add_argument("--target-ongoing", type=float, default=4.0)
    ap.add_argument("--fine-stages", type=int, default=3)
    ap.add_argument("--cv-window", type=float, default=10.0)
    ap.add_argument("--slo-e2e", type=float, default=5.0)
    ap.add_argument("--sim-rate", type=float, default=20.0)
    ap.add_argument(
        "--sim-cvs", type=lambda s: [float(x) for x in s.split(",")], default=[1, 2, 4, 8]
    )
    ap.add_argument("--sim-duration", type=float, default=600.0)
    ap.add_argument(
        "--sim-models",
        type=lambda s: s.split(","),
        default=["llama2-7b", "llama2-13b"],
        help="§9 uses LLaMA2-7B; the first is plotted",
    )
    ap.add_argument("--sim-fine-stages", type=int, default=4)
    ap.add_argument("--sim-coarse-stages", type=int, default=1)
    ap.add_argument(
        "--sim-hop-sensitivity-s",
        type=float,
        default=1e-4,
        help="also run the first model with this per-step stage hop (0: skip)",
    )
    ap.add_argument(
        "--sim-extra-seeds",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[2, 3],
        help="also run the first model (both hops) with these trace seeds: ratios only",
    )
    ap.add_argument(
        "--sim-workloads",
        type=lambda s: s.split(","),
        default=["gamma", "phased"],
        help="gamma (stationary) and/or phased (CV 1 and the CV alternating)",
    )
    ap.add_argument("--sim-phase-s", type=float, default=120.0, help="phase length (phased)")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--skip-runtime", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    report: dict = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_1min_at_start": os.getloadavg()[0],
        },
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "png")},
    }
    earlier = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    if args.skip_sim and "sim" in earlier:  # keep the simulator part of an earlier run
        report["sim"] = earlier["sim"]
        report["sim_settings"] = earlier.get("sim_settings") or earlier.get("settings")
    if not args.skip_sim:
        sim_kw = {
            "cluster": "flexpipe",
            "rate_rps": args.sim_rate,
            "duration_s": args.sim_duration,
            "seed": 1,
            "slo": Slo(ttft_s=5.0, tpot_s=0.2),
            "fine_stages": args.sim_fine_stages,
            "coarse_stages": args.sim_coarse_stages,
            "input_tokens": 512,
            "output_tokens": 128,
        }
        bad = [w for w in args.sim_workloads if w not in WORKLOADS]
        if bad or "gamma" not in args.sim_workloads:
            got = ",".join(args.sim_workloads)
            ap.error(f"--sim-workloads takes gamma or gamma,phased (got {got})")
        by_model = {
            m: run_all(args.sim_cvs, model=m, provisioned=True, **sim_kw) for m in args.sim_models
        }
        report["sim"] = {"by_cv": by_model[args.sim_models[0]], "by_model": by_model}
        if "phased" in args.sim_workloads:
            phased_kw = {**sim_kw, "workload": "phased", "phase_s": args.sim_phase_s}
            first = args.sim_models[0]
            by_cv = run_all(args.sim_cvs, model=first, provisioned=True, **phased_kw)
            seeds = [1, *args.sim_extra_seeds]
            report["sim"]["phased"] = {
                "model": first,
                "phase_s": args.sim_phase_s,
                "by_cv": by_cv,
                "seeds": _seed_ratios(args, phased_kw, seeds, {(1, None): by_cv}),
            }
            print(f"{first}, phased")
            print(json.dumps({cv: row["ratios"] for cv, row in by_cv.items()}, indent=1))
        if args.sim_hop_sensitivity_s > 0:
            hop = args.sim_hop_sensitivity_s
            first = args.sim_models[0]
            by_cv = run_all(args.sim_cvs, model=first, stage_hop_s=hop, provisioned=True, **sim_kw)
            report["sim"]["hop_sensitivity"] = {"model": first, "stage_hop_s": hop, "by_cv": by_cv}
            print(f"{first} at a {hop * 1e3:g}-ms stage hop")
            print(json.dumps({cv: row["ratios"] for cv, row in by_cv.items()}, indent=1))
        for model, by_cv in by_model.items():
            print(model, json.dumps({cv: row["ratios"] for cv, row in by_cv.items()}, indent=1))
        known = {(1, None): by_model[args.sim_models[0]]}
        if "hop_sensitivity" in report["sim"]:
            hop_rows = report["sim"]["hop_sensitivity"]
            known[(1, hop_rows["stage_hop_s"])] = hop_rows["by_cv"]
        seeds = [1, *args.sim_extra_seeds]
        report["sim"]["seeds"] = _seed_ratios(args, sim_kw, seeds, known)
    if not args.skip_runtime:
        report["runtime"] = runtime(args)
        print(json.dumps(report["runtime"]["ratios"], indent=1))
    elif "runtime" in earlier:  # keep the runtime part of an earlier run
        report["runtime"] = earlier["runtime"]
        report["runtime_settings"] = earlier.get("runtime_settings") or earlier.get("settings")
    report["settings"]["cvs"] = [str(c) for c in args.cvs]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    if args.png:
        draw(report, args.png)


if __name__ == "__main__":
    main()
