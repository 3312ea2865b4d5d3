"""FlexPipe Fig. 11 (§9.3, pipeline stall recovery) on the emulated runtime, beside the
simulator at the same setting. Labelled EMULATED.

§9.3: "We define a stall as occurring when response latency exceeds 1.5x the baseline
latency (P25 latency under normal operation), and recovery as the point when latency
returns to within 1.2x of this baseline. The elapsed time between these events constitutes
the recovery duration." Paper at CV 4: median recovery FlexPipe 9 ms, AlpaServe 16 ms,
ServerlessLLM 50 ms. The definition is the simulator's own (`recovery_s` of
`benchmarks/paper/flexpipe/flexpipe_figs.py`, called here, not copied): requests in arrival
order, latency = end-to-end (done - arrival), recovery = the arrival of the first request
back within 1.2x minus the arrival of the one that crossed 1.5x. On the runtime each
request's arrival and end are the controller's own stamps (`serving.request_timeline`),
so a stall is read off the times the real agents' paced steps produced.

The simulator's Fig. 11 runs §9's cluster (82 GPUs, 20 QPS, 2 hours); this one is that
setting scaled to a 2-core box: `--nodes` GPUs of preset `flexpipe` (two per server), one
model (Llama-2 7B as the real small model, as `flexpipe.py`), Gamma arrivals at CV
`--cv` (4) and `--rate` QPS (§9's 20 QPS per 82 GPUs, scaled to the GPUs here) for
`--duration` emulated seconds (a minute, not two hours: at D = 10 a minute of trace is
ten real minutes per system), 512 tokens in, 128 out. The three systems:
- `flexpipe`: as `flexpipe.py` deploys it (one group serving, granularity loop free, up
  to every GPU; copies in every GPU's host memory, §7);
- `alpaserve`: 4-stage pipelines provisioned once for the peak and held (the simulator's
  `provisioned-4`, as Fig. 11's simulator row deploys AlpaServe): the group count is the
  peak the same shape reached autoscaled in the simulator on this trace
  (`alpaserve_groups`, as `flexpipe_figs.fig11_cv` sizes it), all serving before the first
  arrival; `min_replicas` = `max_replicas` = that count;
- `serverlessllm`: whole-model instances, each loaded from its host cache or SSD.
Beside each, the simulator on the same GPUs, trace and deployment
(`flexpipe_sim.run_one`, one warm instance, the agents' batch limit, the deployment's
autoscaler knobs). Times are emulated seconds; each run records D, the host's load and its
violations (a run over 1% is not the cluster's). The figure: each request's latency over
its arrival, both bodies, with the 1.5x / 1.2x P25 lines (the stalls and their ends).

Usage: python -m benchmarks.emulation.flexpipe_fig11 --time-dilation 10 \\
           --json benchmarks/results/emulation/emulation_flexpipe_fig11.json \\
           --png benchmarks/results/emulation/emulation_flexpipe_fig11.png
"""

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import add_cluster_args
from benchmarks.emulation.agents import shrunk_cluster
from benchmarks.emulation.flexpipe import copies, holding, workload
from benchmarks.emulation.report import (
    load_partial,
    partial_path,
    report_head,
    save_partial,
    write_report,
)
from benchmarks.emulation.serving import (
    serve_workload,
    start_logging,
)
from benchmarks.emulation.staging import (
    add_real_model_args,
    emulated_cluster,
    fresh_copies,
    run_on_real_model,
)
from surge.control.spec import autoscaling_from_json
from surge.emulation import Emulation, EmulationConfig

log = logging.getLogger("emulation_flexpipe_fig11")
MODEL = "fp7b"
FIG11_SYSTEMS = ("flexpipe", "alpaserve", "serverlessllm")
VARIANT = {"flexpipe": "flexpipe", "alpaserve": "static-4", "serverlessllm": "serverlessllm"}
"""The runtime variant (`flexpipe.py`'s names) each system runs as."""
SIM_VARIANT = {
    "flexpipe": "flexpipe",
    "alpaserve": "provisioned-4",
    "serverlessllm": "load-then-serve",
}
"""The simulator's variant (`flexpipe_sim.run_one`) each system runs as (Fig. 11's row)."""
PAPER = {
    "source": "FlexPipe §9.3 Fig. 11: median stall recovery at CV 4 FlexPipe 9 ms, 44% "
    "faster than AlpaServe (16 ms), 82% than ServerlessLLM (50 ms); a stall starts at a "
    "response over 1.5x the P25 latency and recovers at the first back within 1.2x",
    "recovery_median_cv4_ms": {"flexpipe": 9, "alpaserve": 16, "serverlessllm": 50},
}


def recovery_s(arrival_s: np.ndarray, latency_s: np.ndarray) -> list[float]:
    """The simulator's Fig. 11 recoveries (`flexpipe_figs.recovery_s`, §9.3's definition)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "paper" / "flexpipe"))
    sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "paper"))
    from flexpipe_figs import recovery_s as figs_recovery_s

    return figs_recovery_s(arrival_s, latency_s)


def stall_summary(arrival_s: list[float], latency_s: list[float]) -> dict[str, Any]:
    """§9.3's stalls of one run from its requests' arrivals and end-to-end latencies: how
    many, their recoveries (median, p90, each), and the P25 baseline."""
    arr, lat = np.asarray(arrival_s, dtype=float), np.asarray(latency_s, dtype=float)
    rec = recovery_s(arr, lat) if len(lat) else []
    return {
        "stalls": len(rec),
        "recovery_median_s": round(float(np.median(rec)), 4) if rec else None,
        "recovery_p90_s": round(float(np.percentile(rec, 90)), 4) if rec else None,
        "recoveries_s": [round(r, 4) for r in rec],
        "p25_latency_s": round(float(np.percentile(lat, 25)), 4) if len(lat) else None,
        "requests": [[round(a, 3), round(x, 4)] for a, x in sorted(zip(arr, lat, strict=True))],
    }


def emulated_stalls(run: dict[str, Any]) -> dict[str, Any]:
    """`stall_summary` of one emulated run: each finished request's arrival and end as the
    controller stamped them (`request_timeline`: arrival, routed, first, second, done, hops)."""
    done = [(r[0], r[4] - r[0]) for r in run["request_timeline"] if r[4] is not None]
    return stall_summary([a for a, _ in done], [x for _, x in done])


def autoscaling(system: str, args: argparse.Namespace, groups: int) -> dict[str, Any]:
    """A system's autoscaler knobs over its own: `flexpipe.py`'s (one kept, up to every
    GPU) for FlexPipe and ServerlessLLM; AlpaServe's `groups` 4-stage groups held."""
    if system == "alpaserve":
        held = {"min_replicas": groups, "max_replicas": groups}
    else:
        held = {"min_replicas": 1, "max_replicas": args.nodes}
    return held | {"target_ongoing_requests": args.target_ongoing}


def spec(system: str, args: argparse.Namespace, groups: int) -> dict[str, Any]:
    variant = VARIANT[system]
    return {
        "name": MODEL,
        "model": str(args.store),
        "strategy": "serverlessllm" if variant == "serverlessllm" else "flexpipe",
        "autoscaling": autoscaling(system, args, groups),
    }


def sim_kw(args: argparse.Namespace, config: EmulationConfig) -> dict[str, Any]:
    """`flexpipe_sim.run_one`'s scenario: the emulated GPUs, trace and batch limit."""
    from surge.sim.settings import Slo

    return {
        "cluster": shrunk_cluster(config.preset, args.nodes),
        "model": config.model,
        "rate_rps": args.rate,
        "duration_s": args.duration,
        "seed": args.seed,
        "slo": Slo(),
        "fine_stages": 4,
        "input_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "max_batch": args.max_num_seqs,
        "warm_instances": 1,
    }


def alpaserve_groups(args: argparse.Namespace, config: EmulationConfig) -> int:
    """AlpaServe's 4-stage groups for the peak: the GPUs the same shape, autoscaled
    (`static-4`), peaked at in the simulator on this trace, over 4 (`fig11_cv`'s sizing)."""
    from benchmarks.systems.flexpipe_sim import run_one

    kw = sim_kw(args, config) | {"change": sim_change("flexpipe", args, 1)}
    peak = run_one("static-4", args.cv, **kw)["gpus_peak"]
    return max(1, -(-int(peak) // 4))


def sim_change(system: str, args: argparse.Namespace, groups: int):
    """The simulator's system with the deployment's autoscaler knobs (the controller's reader)."""
    from dataclasses import replace

    def change(config):
        knobs = autoscaling_from_json(autoscaling(system, args, groups), config.autoscale)
        return replace(config, autoscale=knobs)

    return change


def simulated(args: argparse.Namespace, config: EmulationConfig, groups: int) -> dict:
    """Each system in the simulator at the same setting: its stalls (the same definition)."""
    from benchmarks.systems.flexpipe_sim import run_one

    out: dict = {}
    for system in FIG11_SYSTEMS:
        raw: list = []
        kw = sim_kw(args, config) | {"on_result": raw.append}
        kw["change"] = sim_change(system, args, groups)
        if system == "alpaserve":
            kw["provisioned_groups"] = groups
        summary = run_one(SIM_VARIANT[system], args.cv, **kw)
        res = raw[0]
        done = res.done_s >= 0
        zero = float(res.arrival_s.min())  # a provisioned run's trace starts after its lead
        arr = [float(a) - zero for a in res.arrival_s[done]]
        lat = [float(x) for x in (res.done_s - res.arrival_s)[done]]
        out[system] = stall_summary(arr, lat) | {
            "e2e_p50_s": round(summary["e2e_p50_s"], 4),
            "gpus_peak": summary["gpus_peak"],
            "refactors": summary["refactors"],
            "num_requests": summary["requests"],
        }
    return out


async def run_all(args, tmp: Path, manifest, emulation: Emulation, systems, groups: int) -> dict:
    out: dict = load_partial(args).get("emulated", {}) if args.resume else {}
    if out:
        log.info("--resume: %s finished earlier (%s)", sorted(out), partial_path(args))
    wl = workload(args, args.cv)
    with emulated_cluster(args, tmp, emulation) as cluster:
        for system in [s for s in systems if s not in out]:
            variant = VARIANT[system]
            disks, hosts = copies(variant, args.nodes)
            state, _ = await fresh_copies(cluster, tmp, MODEL, manifest, system, disks, hosts)
            ready = groups if system == "alpaserve" else 1
            with holding(variant):
                res = await serve_workload(
                    cluster,
                    state,
                    emulation,
                    spec(system, args, groups),
                    wl,
                    ready,
                    {"max_num_seqs": args.max_num_seqs},
                )
            res["stall_recovery"] = emulated_stalls(res)
            out[system] = res
            save_partial(args, out)
            st = res["stall_recovery"]
            log.info(
                "%s: stalls %d, median recovery %s s, e2e p50 %s s, GPUs peak %s, "
                "refactors %s, violations %s, load %s",
                system, st["stalls"], st["recovery_median_s"], res["e2e_p50_s"],
                res["max_instances"], (res["flexpipe"] or {}).get("refactors"),
                res["emulation"], res["load_average"],
            )  # fmt: skip
    return out


def main() -> None:
    from benchmarks.emulation.flexpipe_fig11_report import cells, plot

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--cv", type=float, default=4.0, help="§9.3's headline: CV 4")
    ap.add_argument("--rate", type=float, default=2.0, help="§9: 20 QPS per 82 GPUs")
    ap.add_argument("--duration", type=float, default=60.0, help="emulated s of arrivals")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=128, help="§9: 128")
    ap.add_argument("--systems", default="", help="comma list of " + ", ".join(FIG11_SYSTEMS))
    ap.add_argument("--target-ongoing", type=float, default=4.0)
    add_real_model_args(ap)
    ap.add_argument(
        "--json",
        type=Path,
        default=Path("benchmarks/results/emulation/emulation_flexpipe_fig11.json"),
    )
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--resume", action="store_true", help="keep runs a cut-off sitting finished")
    ap.add_argument(
        "--from-partial",
        action="store_true",
        help="no cluster: the result from the runs a cut-off sitting with the same settings "
        "finished (its partial file), the simulator beside them",
    )
    add_cluster_args(ap)
    ap.set_defaults(emulate="flexpipe:llama2-7b", time_dilation=10.0)
    args = ap.parse_args()
    args.max_prompt, args.max_tokens = args.prompt_tokens, args.output_tokens
    from_partial = vars(args).pop("from_partial")  # not a setting: the partial's must match
    chosen = [s for s in args.systems.split(",") if s] or list(FIG11_SYSTEMS)
    if unknown := sorted(set(chosen) - set(FIG11_SYSTEMS)):
        ap.error(
            f"--systems: unknown {', '.join(unknown)} (choose among {', '.join(FIG11_SYSTEMS)})"
        )
    start_logging()
    config = EmulationConfig.parse(args.emulate, args.time_dilation)
    groups = alpaserve_groups(args, config)
    report: dict = report_head(args, config, PAPER) | {"cv": args.cv, "rate_qps": args.rate}
    report["alpaserve_groups"] = groups
    if from_partial:  # the sitting's own loads are its runs' (`load_average` at each end)
        report["emulated"] = load_partial(args).get("emulated", {})
        report["machine"]["load_average_start"] = None
        if not report["emulated"]:
            ap.error(f"--from-partial: no runs with these settings in {partial_path(args)}")
    else:
        report["emulated"], report["real_model_bytes"] = run_on_real_model(
            args, config, lambda tmp, m, e: run_all(args, tmp, m, e, chosen, groups)
        )
    report["simulated"] = simulated(args, config, groups)
    report["report_emulated"] = cells(report)
    write_report(args, report, plot)
    log.info("%s", report["report_emulated"][0]["emulated"])


if __name__ == "__main__":
    main()
