"""FlexPipe §9 on the emulated runtime: Gamma arrivals of a given CV, FlexPipe vs static
pipeline shapes and ServerlessLLM, beside the simulator. Labelled EMULATED.

The paper's setting scaled to `--nodes` GPUs (§9: 42 servers, 82 GPUs, 100 Gb/s, 20 QPS
over the cluster; preset `flexpipe`, its first `--nodes` GPUs, two per server), Llama-2 7B
(one of §9's models), at `--time-dilation D`. Per CV in `--cvs`, the same Gamma trace
(`surge.traces.gamma.gamma_trace`, `--rate` QPS: §9's 20 QPS per 82 GPUs, scaled to the
GPUs here) for `--duration` emulated seconds, `--prompt-tokens` in, `--output-tokens` out
(§9: 128), served by:
- `flexpipe`: the granularity loop free to choose among 1/2/4/8 stages (Eq. 4), split and
  merge in flight;
- `static-N` (each of `--statics`): the same system held at N stages (its one FlexPipe
  settings object, as `benchmarks/systems/flexpipe_sim.py` holds it);
- `serverlessllm`: whole-model local instances, each loaded from its host cache or SSD.
Every variant starts with one instance serving (§9: FlexPipe keeps a share of the peak
ready; here one instance), the same autoscaler target, and scales up to every GPU; its
copies are where its system's host cache keeps them (`copies`: the model in host memory
on the first GPU, on every other one's disk; in every GPU's host memory for FlexPipe,
whose §7 middle tier keeps "parameter copies in host memory even after GPU eviction",
`host_cache="all"`). One cluster of agents serves every run in turn. Beside it, the
simulator on the same GPUs, trace and variants, deployed as the runtime deploys them
(`flexpipe_sim.run_one`: one warm instance, the agents' batch limit, the deployment's
autoscaler knobs over the system's, read by the runtime's own `autoscaling_from_json`).
Times are emulated seconds; the JSON records D, the host's load and each run's violations.

Usage: python -m benchmarks.emulation.flexpipe --time-dilation 40 \\
           --json benchmarks/results/emulation/emulation_flexpipe.json \\
           --png benchmarks/results/emulation/emulation_flexpipe.png
"""

import argparse
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.common import add_cluster_args
from benchmarks.emulation.agents import shrunk_cluster
from benchmarks.emulation.report import (
    load_partial,
    partial_path,
    report_head,
    save_partial,
    write_report,
)
from benchmarks.emulation.serving import (
    Workload,
    percentile,
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
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.systems import SYSTEMS, SystemConfig
from surge.traces.gamma import gamma_trace

log = logging.getLogger("emulation_flexpipe")
MODEL = "fp7b"
PAPER = {
    "source": "FlexPipe §9.1 Fig. 8: at CV=1 38.3% lower latency than AlpaServe and "
    "ServerlessLLM; at CV=4 66.1% lower than AlpaServe, 80.6% lower than MuxServe, "
    "ServerlessLLM's throughput -40.4%",
    "latency_flexpipe_over_sllm_cv1": 0.617,
    "latency_flexpipe_over_static_cv4": 0.339,
}


def workload(args, cv: float) -> Workload:
    t = gamma_trace(args.rate, cv, args.duration, args.seed, args.prompt_tokens, args.output_tokens)
    return Workload(
        tuple(float(a) for a in t.arrival_s),
        tuple(int(p) for p in t.input_tokens),
        tuple(int(o) for o in t.output_tokens),
    )


def strategy(variant: str) -> str:
    return "serverlessllm" if variant == "serverlessllm" else "flexpipe"


def autoscaling(args) -> dict:
    """Every variant's autoscaler knobs (over its system's): one instance kept, up to
    every GPU, `--target-ongoing` requests per instance."""
    return {
        "min_replicas": 1,
        "max_replicas": args.nodes,
        "target_ongoing_requests": args.target_ongoing,
    }


def spec(variant: str, args) -> dict:
    return {
        "name": MODEL,
        "model": str(args.store),
        "strategy": strategy(variant),
        "autoscaling": autoscaling(args),
    }


def held_at(variant: str) -> FlexPipeSettings | None:
    """A static variant's FlexPipe settings: one stage count (None: as shipped)."""
    if not variant.startswith("static-"):
        return None
    return FlexPipeSettings(stage_counts=(int(variant.split("-")[1]),), cv_targets=(0.0,))


@contextmanager
def holding(variant: str) -> Iterator[None]:
    """While inside: the `flexpipe` system held at `variant`'s stage count (`held_at`; as
    shipped for the others), read by the controller and the scale-out alike."""
    original = SYSTEMS["flexpipe"]
    settings = held_at(variant)
    if settings is not None:
        SYSTEMS["flexpipe"] = replace(original, flexpipe=settings)
    try:
        yield
    finally:
        SYSTEMS["flexpipe"] = original


def copies(variant: str, nodes: int) -> tuple[list[int], list[int]]:
    """(nodes with the model on disk, nodes with it in host memory) as a run starts, where
    the simulator's system keeps it: the first GPU's host memory (its instance serves) and
    every other GPU's disk; every GPU's host memory where the system's host cache holds
    every model (`host_cache="all"`, FlexPipe §7)."""
    hosts = list(range(nodes)) if SYSTEMS[strategy(variant)].host_cache == "all" else [0]
    return list(range(1, nodes)), hosts


def deployed(variant: str, args) -> Callable[[SystemConfig], SystemConfig]:
    """The simulator's system as the runtime deploys `variant`: the deployment's
    autoscaler knobs (`spec`) over the system's, by the controller's own reader."""

    del variant  # every variant's knobs are the same (`autoscaling`)

    def change(config: SystemConfig) -> SystemConfig:
        knobs = autoscaling_from_json(autoscaling(args), config.autoscale)
        return replace(config, autoscale=knobs)

    return change


async def run_all(args, tmp: Path, manifest, emulation: Emulation, variants, cvs) -> dict:
    out: dict = load_partial(args).get("emulated", {}) if args.resume else {}
    if out:
        done = {cv: list(row) for cv, row in out.items()}
        log.info("--resume: %s finished earlier (%s)", done, partial_path(args))
    cluster = emulated_cluster(args, tmp, emulation)
    with cluster:
        for cv in cvs:
            wl = workload(args, cv)
            for variant in [v for v in variants if v not in out.get(f"{cv:g}", {})]:
                disks, hosts = copies(variant, args.nodes)
                state, _ = await fresh_copies(
                    cluster, tmp, MODEL, manifest, f"{variant}-{cv:g}", disks, hosts
                )
                with holding(variant):
                    res = await serve_workload(
                        cluster,
                        state,
                        emulation,
                        spec(variant, args),
                        wl,
                        1,
                        {"max_num_seqs": args.max_num_seqs},
                    )
                out.setdefault(f"{cv:g}", {})[variant] = res
                save_partial(args, out)
                log.info(
                    "cv %g %s: e2e p50/p99 %s/%s s, ttft p50 %s, refactors %s, violations %s",
                    cv, variant, res["e2e_p50_s"], res["e2e_p99_s"], res["ttft_p50_s"],
                    (res["flexpipe"] or {}).get("refactors"), res["emulation"],
                )  # fmt: skip
    return out


def scenario(settings: dict) -> SimpleNamespace:
    """The knobs `simulate_one` reads, from a result's `settings` (as the JSON records them)."""
    return SimpleNamespace(
        rate=float(settings["rate"]),
        duration=float(settings["duration"]),
        seed=int(settings["seed"]),
        prompt_tokens=int(settings["prompt_tokens"]),
        output_tokens=int(settings["output_tokens"]),
        nodes=int(settings["nodes"]),
        target_ongoing=float(settings["target_ongoing"]),
        max_num_seqs=int(settings["max_num_seqs"]),
    )


def simulate_one(args, config: EmulationConfig, cv: float, variant: str) -> tuple[dict, Any]:
    """The simulator's run of one (CV, variant) as the runtime deploys it: its summary
    (`flexpipe_sim.run_one`) and raw `SimResult` (per-request times and endpoints)."""
    from benchmarks.systems.flexpipe_sim import run_one
    from surge.sim.settings import Slo

    raw: list = []
    summary = run_one(
        "load-then-serve" if variant == "serverlessllm" else variant,
        cv,
        cluster=shrunk_cluster(config.preset, args.nodes),  # type: ignore[arg-type]
        model=config.model,
        rate_rps=args.rate,
        duration_s=args.duration,
        seed=args.seed,
        slo=Slo(),
        fine_stages=4,
        input_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        on_result=raw.append,
        change=deployed(variant, args),
        max_batch=args.max_num_seqs,
        warm_instances=1,
    )
    return summary, raw[0]


def simulated(args, config: EmulationConfig, variants, cvs) -> dict:
    """The simulator's run of each (CV, variant): latencies, TTFTs and refactors."""
    out: dict = {}
    for cv in cvs:
        for variant in variants:
            r, res = simulate_one(args, config, cv, variant)
            ttft = [float(f - a) for f, a in zip(res.first_token_s, res.arrival_s, strict=True)]
            keys = ("e2e_p50_s", "e2e_p99_s", "e2e_mean_s", "ttft_p50_s", "ttft_p99_s")
            out.setdefault(f"{cv:g}", {})[variant] = {
                k: round(r[k], 4) if r[k] is not None else None for k in keys
            } | {
                "ttft_p90_s": percentile(ttft, 90),
                "ttfts_s": sorted(round(x, 4) for x in ttft),
                "refactors": r["refactors"],
                "gpu_seconds": round(r["gpu_seconds"], 2),
            }
    return out


def sim_over_emulated(report: dict) -> dict:
    """Per (CV, variant): the simulator's TTFT p50 / p90 and e2e mean over the emulated
    runtime's (the issue's bar: within 15%, i.e. 0.85-1.15)."""
    out: dict = {}
    for cv, row in report["emulated"].items():
        for v, emu in row.items():
            sim = report["simulated"].get(cv, {}).get(v) or {}
            out.setdefault(cv, {})[v] = {
                k: round(sim[k] / emu[k], 3) if sim.get(k) and emu.get(k) else None
                for k in ("ttft_p50_s", "ttft_p90_s", "e2e_mean_s")
            }
    return out


def ratios(by_cv: dict) -> dict:
    """Each variant's e2e mean / p99 and TTFT p50 over flexpipe's (> 1: flexpipe better)."""
    out: dict = {}
    for cv, row in by_cv.items():
        fp = row.get("flexpipe")
        if not fp:
            continue
        out[cv] = {
            v: {
                k: round(r[k] / fp[k], 3) if r.get(k) and fp.get(k) else None
                for k in ("e2e_mean_s", "e2e_p99_s", "ttft_p50_s")
            }
            for v, r in row.items()
            if v != "flexpipe"
        }
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cvs = list(report["emulated"])
    variants = list(report["emulated"][cvs[0]])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(variants)
    for ax, key, title in zip(
        axes, ("e2e_mean_s", "e2e_p99_s"), ("mean latency", "p99 latency"), strict=True
    ):
        for i, v in enumerate(variants):
            for body, hatch in (("emulated", ""), ("simulated", "//")):
                vals = [(report[body].get(cv, {}).get(v) or {}).get(key) or 0 for cv in cvs]
                off = (i - len(variants) / 2 + 0.5) * width
                ax.bar(
                    [
                        j + off + (0.5 * width / 2 if hatch else -0.5 * width / 2)
                        for j in range(len(cvs))
                    ],
                    vals,
                    width / 2,
                    hatch=hatch,
                    label=f"{v} ({body})",
                )
        ax.set_xticks(range(len(cvs)), [f"CV={cv}" for cv in cvs])
        ax.set_ylabel(f"{title} (emulated s)")
        ax.set_title(title)
    axes[0].legend(fontsize=6)
    fig.suptitle(
        f"EMULATED {report['emulate']}, {report['nodes']} GPUs, D={report['time_dilation']:g}, "
        f"{report['rate_qps']} QPS Gamma arrivals"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--cvs", default="1,4")
    ap.add_argument("--rate", type=float, default=2.0, help="§9: 20 QPS per 82 GPUs")
    ap.add_argument("--duration", type=float, default=8.0, help="emulated s of arrivals per CV")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=128, help="§9: 128")
    ap.add_argument("--statics", default="1,2,4,8", help="static stage counts compared ('': none)")
    ap.add_argument(
        "--systems",
        default="",
        help="the variants run on the emulation this time (comma list of flexpipe, static-N, "
        "serverlessllm; '': all); the simulator runs all of them",
    )
    ap.add_argument("--target-ongoing", type=float, default=4.0)
    add_real_model_args(ap)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--json", type=Path, default=Path("benchmarks/results/emulation/emulation_flexpipe.json")
    )
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the (CV, variant) runs an earlier invocation with the same settings "
        "finished (in $TMPDIR/<json stem>.partial.json) and run only the others",
    )
    add_cluster_args(ap)
    ap.set_defaults(emulate="flexpipe:llama2-7b", time_dilation=40.0)
    args = ap.parse_args()
    args.max_prompt, args.max_tokens = args.prompt_tokens, args.output_tokens
    start_logging()
    config = EmulationConfig.parse(args.emulate, args.time_dilation)
    cvs = [float(c) for c in args.cvs.split(",")]
    statics = [f"static-{n}" for n in args.statics.split(",") if n]
    variants = ["flexpipe", *statics, "serverlessllm"]
    chosen = [v for v in args.systems.split(",") if v] or variants
    if unknown := sorted(set(chosen) - set(variants)):
        ap.error(f"--systems: unknown {', '.join(unknown)} (choose among {', '.join(variants)})")
    report: dict = report_head(args, config, PAPER) | {"rate_qps": args.rate}
    report["emulated"], report["real_model_bytes"] = run_on_real_model(
        args, config, lambda tmp, m, e: run_all(args, tmp, m, e, chosen, cvs)
    )
    # every CV with emulated runs (a --resume sitting may have run others than `--cvs`)
    sim_cvs = sorted({float(c) for c in report["emulated"]} | set(cvs))
    report["simulated"] = simulated(args, config, variants, sim_cvs)
    report |= derived(report)
    write_report(args, report, plot)
    print(json.dumps(report["ratios_to_flexpipe"], indent=1))


def derived(report: dict) -> dict:
    """What a result derives from its two columns: sim / emulated and the ratios."""
    return {
        "sim_over_emulated": sim_over_emulated(report),
        "ratios_to_flexpipe": {
            "emulated": ratios(report["emulated"]),
            "simulated": ratios(report["simulated"]),
        },
    }


if __name__ == "__main__":
    main()
