"""FlexPipe under load variability: Gamma arrivals of CV 1, 2, 4, 8 at the same mean rate.

Four variants compared in the same run (paper 003 §9):
- `flexpipe`: the `flexpipe` strategy, the granularity loop free to split and merge;
- `static-fine`: the same strategy held at `--fine-stages` stages (one granularity);
- `static-coarse`: the same strategy held at one stage per pipeline (each node a full copy;
  more pipelines only by autoscaling);
- `load-then-serve`: the `serverlessllm` strategy (local instances load, then serve).
Two bodies:
1. the runtime (`benchmarks/systems/flexpipe_cv_runtime.py`: `surge serve`'s controller in
   process, loopback agents, a tiny Llama built there): per variant a fresh cluster, then
   one phase per CV (arrivals for `--duration` s, drained, then `--gap` s idle). Per
   phase: p50/p99 end-to-end latency, p50/p99 queue time (arrival until an endpoint took
   the request, polled every 10 ms), p50/p99 TTFT, goodput (requests meeting `--slo-e2e`
   per second of the phase), GPU-seconds (slots held x time, sampled every 50 ms), the
   slots always held (10th percentile) and the peak, and the refactorings by direction.
   The static variants hold the system's one set of FlexPipe settings
   (`SystemConfig.flexpipe`, read by the controller and the scale-out) at one granularity;
2. the simulator at the paper's scale (`benchmarks/systems/flexpipe_sim.py`: the `flexpipe`
   cluster profile of §9, 82 GPUs, `--sim-rate` 20 QPS, CV 1/2/4/8; static variants at
   every stage count flexpipe chooses among), the first model also with a 0.1-ms stage
   hop, and the ratios again for `--sim-extra-seeds` trace seeds; with `phased` in
   `--sim-workloads`, the first model again on phases alternating CV 1 and the CV
   (`--sim-phase-s`; §3.3 Fig. 1, §9 Fig. 9a), every seed, both hops. Everywhere also
   §9's static baselines provisioned once for the peak (`provisioned-1/2/4/8`: a fixed
   group count, the same shape's autoscaled peak on the trace, held throughout) and the
   same fixed statics at flexpipe's GPU-seconds (`isocost-1/2/4/8`). A counterfactual,
   `no_busy_merges`: flexpipe whose busy groups never merge, against the same rows'
   statics, every model (gamma) and the first on the phased workload (seed 1, system hop;
   `--sim-only no-busy-merges` runs just it and keeps the rest of `--json`).
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
import json
import logging
import os
import platform
from pathlib import Path

from benchmarks.systems.flexpipe_cv_plot import draw
from benchmarks.systems.flexpipe_cv_runtime import runtime
from benchmarks.systems.flexpipe_ratios import ratios
from benchmarks.systems.flexpipe_sim import (
    WORKLOADS,
    no_busy_merges,
    run_all,
    run_one,
)
from surge.sim.settings import Slo


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


def _no_busy_merges(args: argparse.Namespace, sim_kw: dict, sim: dict) -> dict:
    """{"gamma": {model: {cv: ...}}, "phased": {cv: ...}}: flexpipe with busy merges off
    (`flexpipe_sim.no_busy_merges`) on the traces of `sim`'s rows, its numbers and its
    ratios against those rows' statics (which never refactor, so they are unchanged)."""

    def rows(by_cv: dict, kw: dict) -> dict:
        out = {}
        for cv, row in by_cv.items():
            fp = run_one("flexpipe", float(cv), change=no_busy_merges, **kw)
            out[cv] = {
                "flexpipe": fp,
                "ratios": ratios({**row, "flexpipe": fp}, kw["fine_stages"], kw["coarse_stages"]),
            }
            logging.info("no busy merges %s cv=%s: p99 %.2f", kw["model"], cv, fp["e2e_p99_s"])
        return out

    out: dict = {
        "gamma": {m: rows(by_cv, {**sim_kw, "model": m}) for m, by_cv in sim["by_model"].items()}
    }
    if "phased" in sim:
        ph = sim["phased"]
        kw = {**sim_kw, "model": ph["model"], "workload": "phased", "phase_s": ph["phase_s"]}
        out["phased"] = rows(ph["by_cv"], kw)
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
    ap.add_argument(
        "--sim-only",
        choices=["no-busy-merges"],
        help="run only this part of the simulator half; the rest is kept from --json",
    )
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
    if args.sim_only:  # one part, on the earlier run's rows; everything else kept
        if "sim" not in earlier:
            ap.error("--sim-only needs an earlier --json with the simulator half")
        was = earlier.get("sim_settings") or earlier.get("settings") or {}
        keys = ("sim_rate", "sim_duration", "sim_fine_stages", "sim_coarse_stages")
        if any(was.get(k) != getattr(args, k) for k in keys):
            ap.error(f"--sim-only: the earlier run's {keys} differ from these")
        earlier["sim"]["no_busy_merges"] = _no_busy_merges(args, sim_kw, earlier["sim"])
        args.json.write_text(json.dumps(earlier, indent=1, default=str))
        return
    if not args.skip_sim:
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
        report["sim"]["no_busy_merges"] = _no_busy_merges(args, sim_kw, report["sim"])
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
