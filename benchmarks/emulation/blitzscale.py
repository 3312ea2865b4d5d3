"""BlitzScale §6.1 on the emulated runtime: an AzureCode burst, TTFT and TBT of BlitzScale vs
ServerlessLLM (SSD) and AllCache, beside the simulator. Labelled EMULATED.

The paper's 7B setting (§6.1 Fig. 13, §6.2: Llama-2 7B on AzureCode, cluster A's A800s as
one-GPU logical hosts with a 100 Gb/s RDMA NIC each, SSD 10 Gb/s, PCIe 128 Gb/s; preset
`blitzscale-a-hosts`), its first `--nodes` hosts, at `--time-dilation D`. The requests are
the AzureCode trace's (`azure-code`, its gaps divided by `--rate-scale`: §6.1's x2) from
`--start` for `--duration` emulated seconds, prompts clipped to the emulated model's context.
Every system runs §6.1's way: P/D disaggregated (one prefill and one decode instance serving
when the burst starts), BlitzScale's monitor and autoscaler settings, the deployment's TTFT
SLO 450 ms (§3: Llama-2 7B); only where new weights come from differs:
- `blitzscale`: multicast chains from the serving instances over the NICs, live scaling
  (zigzag) while layers arrive, prefill->decode mutation;
- `serverlessllm`: each new instance loads from its own host cache on a hit, else its SSD
  (the model on every host's disk, as ServerlessLLM stores it, §2); keep-alive 300 s;
- `allcache`: ServerlessLLM with the model in every host's memory (§6: "always load the
  parameters from the host cache").
Each system starts from the same copies: the model in host memory on the first two hosts
(where the first instances start; AllCache: on every host) and, for ServerlessLLM, on every
host's disk. One cluster of
agents serves the three in turn. Beside it, the simulator on the same hosts, requests and
systems (`benchmarks/paper/blitzscale/blitzscale_setup.systems_6_1`, two warm instances).
Every time is in emulated seconds; the JSON records D, the host's load and each run's violations.

Usage: python -m benchmarks.emulation.blitzscale --time-dilation 80 \\
           --json benchmarks/results/emulation/emulation_blitzscale.json \\
           --png benchmarks/results/emulation/emulation_blitzscale.png
"""

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

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
from surge.config import EngineConfig
from surge.emulation import Emulation, EmulationConfig
from surge.model.manifest import Manifest
from surge.policy.systems import system_config
from surge.traces.resolve import load_trace

log = logging.getLogger("emulation_blitzscale")
MODEL = "code7b"
SYSTEMS = ("blitzscale", "serverlessllm", "allcache")
PAPER = {
    "source": "BlitzScale §6.1 Fig. 13: on AzureCode with Llama-2 7B, 55.5% shorter TTFT and "
    "57.8% shorter TBT than ServerlessLLM; close to AllCache, faster than it on AzureCode",
    "ttft_blitzscale_over_sllm": 0.445,
    "tbt_blitzscale_over_sllm": 0.422,
}
TTFT_SLO_MS = 450.0
"""BlitzScale §3: the TTFT SLO of Llama-2 7B."""
TBT_SLO_MS = 150.0
"""BlitzScale §3: the TBT SLO of Llama-2 7B (its load monitor's decode bound, §5.3)."""
SLLM_KEEP_ALIVE_S = 300.0
"""ServerlessLLM's host-cache keep-alive as BlitzScale ran it (§3: "a 5-minute keep-alive")."""


def workload(args) -> Workload:
    """The trace's requests from `--start` for `--duration` emulated s, at `--rate-scale`."""
    trace = load_trace(args.trace)
    at = trace.arrival_s / args.rate_scale
    pick = (at >= args.start) & (at < args.start + args.duration)
    prompts = np.clip(trace.input_tokens[pick], 1, args.max_prompt)
    outputs = np.clip(trace.output_tokens[pick], 1, args.max_tokens)
    return Workload(
        tuple(float(a - args.start) for a in at[pick]),
        tuple(int(p) for p in prompts),
        tuple(int(o) for o in outputs),
    )


def strategy_of(system: str) -> str:
    """The strategy `surge serve` runs a §6.1 system as (AllCache: ServerlessLLM with every
    host's memory staged); an ablation step (`blitzscale_ablation.py`) names its own."""
    return "blitzscale" if system == "blitzscale" else "serverlessllm"


def spec(system: str, args, strategy: str | None = None) -> dict:
    """§6.1's deployment: P/D, BlitzScale's monitor for every system (as `systems_6_1`)."""
    strategy = strategy or strategy_of(system)
    return {
        "name": MODEL,
        "model": str(args.store),
        "strategy": strategy,
        "pd": {"prefill": 1, "decode": 1},
        "slo": {"ttft_ms": TTFT_SLO_MS, "tpot_ms": TBT_SLO_MS},
        # BlitzScale's §5.3 monitor for both (bounds profiled from the emulated cost model
        # and this SLO, `policy.blitzscale.monitor`; until 2026-11-28: 8 requests in flight,
        # 2,000 tokens/s and 0.8 KV use per instance)
        "autoscaling": {
            "min_replicas": 2,
            "max_replicas": args.nodes,
            "count_in_flight": False,
            "profile_bounds": True,
            "target_kv_usage": 0.8,
            "downscale_delay_s": 2.0,
        },
    }


ENGINE_PREFILL_TOKENS = EngineConfig().max_prefill_tokens
"""Most prompt tokens the emulated agents' engines prefill in one step (`LocalCluster` builds
their `EngineConfig` with its default, 4096): the simulator beside runs the same budget. It
ran its own default, 8192, until this was found (one 8-request prefill step of 8192 tokens
where the runtime's engines ran two of 4096: the batch's first half waited for the second,
ServerlessLLM's p90 +18%, BlitzScale's first requests' TTFT +0.34 s)."""

SIM_SLLM_INIT_S = system_config("serverlessllm").init_s
"""ServerlessLLM's and AllCache's engine start in the simulator beside the emulated run: the
shipped, unsourced 0.5 s (`policy/systems.py`), which the emulated runtime paces on its
clock (`runtime/scaleout/local.engine_start`). Until the runtime paced it (runs before
this change) both sides used 0, as `simulated_engine_start_s` of those results says."""


def simulated(
    args,
    config: EmulationConfig,
    wl: Workload,
    sllm_init_s: float | None,
    systems: dict | None = None,
) -> dict:
    """The simulator on the same hosts, requests and §6.1 systems (or `systems`, name ->
    `SystemConfig`), two instances warm; ServerlessLLM's and AllCache's engine start
    `sllm_init_s` (None: the shipped one)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "paper" / "blitzscale"))
    from blitzscale_setup import systems_6_1

    from surge.sim.settings import SimSettings, Slo
    from surge.sim.simulator import simulate
    from surge.traces.request import make_trace

    cluster = shrunk_cluster(config.preset, args.nodes)
    trace = make_trace("burst", list(wl.arrival_s), list(wl.prompt_tokens), list(wl.output_tokens))
    out = {}
    for name, system in (systems or systems_6_1(sllm_init_s)).items():
        settings = SimSettings(
            cluster,
            (config.model,),
            name,
            slo=Slo(TTFT_SLO_MS / 1000, 0.15),
            warm_instances=2,
            max_batch=args.max_num_seqs,
            max_prefill_tokens=ENGINE_PREFILL_TOKENS,
        )
        r = simulate(trace, settings, system=system)
        ttft = [float(f - a) for f, a in zip(r.first_token_s, r.arrival_s, strict=True)]
        # the mean gap between tokens over every token after a first (the emulated runtime's
        # `tbt_mean_s`: each request's gaps pooled), of the requests that finished
        ok = (r.done_s >= 0) & (r.output_tokens > 1)
        gaps = float((r.output_tokens[ok] - 1).sum())
        out[name] = {
            "tbt_mean_s": round(float((r.done_s - r.first_token_s)[ok].sum()) / gaps, 5)
            if gaps
            else None,
            "ttft_mean_s": round(float(np.mean(ttft)), 4),
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p90_s": percentile(ttft, 90),
            "ttft_p99_s": percentile(ttft, 99),
            # per request, in trace order: beside the emulated `request_timeline`
            "ttfts_by_request_s": [round(x, 4) for x in ttft],
            # each live batch: [start, layers on the new instance, layers it held, requests]
            "live_batches": [
                [round(b.start_s, 3), b.split[0], b.held_layers, list(b.request_ids)]
                for b in r.live_batches
            ],
        }
    return out


def ratios(res: dict, base: str = "blitzscale") -> dict:
    keys = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tbt_mean_s", "tbt_p50_s")
    b = res.get(base)
    if b is None:  # a first sitting that ran only the baselines: nothing to divide by yet
        return {}
    return {
        n: {k: round(b[k] / r[k], 3) if b.get(k) and r.get(k) else None for k in keys}
        for n, r in res.items()
        if n != base
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, res in report["emulated"].items():
        xs = res["ttfts_s"]
        a.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
        t = [p[0] for p in res["instances_timeline"]]
        b.step(t, [p[1] for p in res["instances_timeline"]], where="post", label=name)
    a.set_xscale("log")
    a.set_xlabel("TTFT (emulated s)")
    a.set_ylabel("fraction of requests")
    a.legend()
    b.set_xlabel("emulated s from the burst's start")
    b.set_ylabel("instances (loading or serving)")
    b.legend()
    fig.suptitle(
        f"EMULATED {report['emulate']}, {report['nodes']} hosts, D={report['time_dilation']:g}, "
        f"{report['requests']} AzureCode requests"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def run_all(
    args,
    tmp: Path,
    manifest: Manifest,
    emulation: Emulation,
    wl: Workload,
    strategies: dict[str, str] | None = None,
):
    """Each of `--systems` in turn on one cluster, from §6.1's copies; `strategies` names
    the strategy a system runs as (default `strategy_of`)."""
    earlier = load_partial(args) if args.resume else {}
    out, staging = earlier.get("emulated", {}), earlier.get("staging", {})
    if out:
        log.info("--resume: %s finished earlier (%s)", ", ".join(out), partial_path(args))
    todo = [s for s in args.systems.split(",") if s not in out]
    if not todo:  # every system finished earlier: only the report is written, and this
        # invocation's load says nothing of theirs (each run keeps its own `load_average`)
        args.report_only = True
        return out, staging
    cluster = emulated_cluster(args, tmp, emulation)
    with cluster:
        for system in todo:
            strategy = (strategies or {}).get(system) or strategy_of(system)
            hosts = list(range(args.nodes)) if system == "allcache" else [0, 1]
            disks = list(range(args.nodes)) if system == "serverlessllm" else []
            state, staged_s = await fresh_copies(
                cluster, tmp, MODEL, manifest, system, disks, hosts
            )
            staging[system] = round(staged_s, 1)
            controller = {"max_num_seqs": args.max_num_seqs}
            if strategy == "serverlessllm":
                controller["host_keep_alive_s"] = SLLM_KEEP_ALIVE_S
            out[system] = await serve_workload(
                cluster,
                state,
                emulation,
                spec(system, args, strategy),
                wl,
                2,
                controller,
                args.drain,
                on_result=lambda r, s=system: save_partial(args, out | {s: r}, staging=staging),
            )
            log.info(
                "%s: %s",
                system,
                {
                    k: v
                    for k, v in out[system].items()
                    if k not in ("ttfts_s", "instances_timeline", "request_timeline")
                },
            )
            save_partial(args, out, staging=staging)
    return out, staging


def parser(description: str, systems: tuple[str, ...], json: Path) -> argparse.ArgumentParser:
    """The §6.1 emulation's flags (also the ablation's, `blitzscale_ablation.py`)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--trace", default="azure-code")
    ap.add_argument("--rate-scale", type=float, default=2.0, help="§6.1 scales AzureCode x2")
    ap.add_argument("--start", type=float, default=424.0, help="emulated s into the scaled trace")
    ap.add_argument("--duration", type=float, default=4.0, help="emulated s of arrivals")
    ap.add_argument("--max-prompt", type=int, default=4000, help="Llama-2's 4096 context")
    ap.add_argument("--max-tokens", type=int, default=64)
    add_real_model_args(ap)
    ap.add_argument("--systems", default=",".join(systems))
    ap.add_argument(
        "--drain",
        type=float,
        default=None,
        help="stop this many emulated s after every request's first token (default: when all "
        "are done); TBT then counts the tokens seen until then",
    )
    ap.add_argument("--json", type=Path, default=json)
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the systems an earlier invocation with the same settings finished "
        "(kept in $TMPDIR/<json stem>.partial.json) and run only the others: a long "
        "comparison in several sittings",
    )
    ap.add_argument("--png", type=Path, default=None)
    add_cluster_args(ap)
    ap.set_defaults(emulate="blitzscale-a-hosts:llama2-7b", time_dilation=80.0)
    return ap


def parse_setting(
    ap: argparse.ArgumentParser, systems: tuple[str, ...]
) -> tuple[argparse.Namespace, EmulationConfig, Workload]:
    """The flags of `parser`, checked (every `--systems` one of `systems`, a request in the
    window), logging started: the arguments, the emulation and the requests."""
    args = ap.parse_args()
    start_logging()
    if unknown := [s for s in args.systems.split(",") if s not in systems]:
        ap.error(f"unknown system {unknown[0]}; choose from {', '.join(systems)}")
    wl = workload(args)
    if not wl.num_requests:
        ap.error(f"no request of {args.trace} in the window; move --start or widen --duration")
    return args, EmulationConfig.parse(args.emulate, args.time_dilation), wl


def workload_head(args: argparse.Namespace, wl: Workload) -> dict:
    """The result JSON's record of the requests."""
    return {
        "requests": wl.num_requests,
        "workload": {
            "trace": f"{args.trace} x{args.rate_scale:g}",
            "window_s": [args.start, args.start + args.duration],
            "prompt_tokens_mean": round(float(np.mean(wl.prompt_tokens)), 1),
            "output_tokens_mean": round(float(np.mean(wl.output_tokens)), 1),
        },
    }


def main() -> None:
    ap = parser(
        __doc__.split("\n")[0],
        SYSTEMS,
        Path("benchmarks/results/emulation/emulation_blitzscale.json"),
    )
    args, config, wl = parse_setting(ap, SYSTEMS)
    report: dict = report_head(args, config, PAPER) | workload_head(args, wl)
    (report["emulated"], report["staging_real_s"]), report["real_model_bytes"] = run_on_real_model(
        args, config, lambda tmp, m, e: run_all(args, tmp, m, e, wl)
    )
    if getattr(args, "report_only", False):
        report["machine"]["load_average_start"] = None
        report["machine"]["loads"] = "per run: each system's load_average (its own sitting)"
    report["simulated"] = simulated(args, config, wl, SIM_SLLM_INIT_S)
    report["simulated_engine_start_s"] = {
        "serverlessllm": SIM_SLLM_INIT_S,
        "allcache": SIM_SLLM_INIT_S,
    }
    report["simulated_max_prefill_tokens"] = ENGINE_PREFILL_TOKENS
    report["ratios_to_blitzscale"] = {
        "emulated": ratios(report["emulated"]),
        "simulated": ratios(report["simulated"]),
    }
    report["sim_error"] = {
        n: {
            k: round(s[k] / e[k] - 1, 3) if e.get(k) else None
            for k in ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s")
        }
        for n, s in report["simulated"].items()
        if (e := report["emulated"].get(n))
    }
    write_report(args, report, plot)
    print(json.dumps({k: report[k] for k in ("ratios_to_blitzscale", "sim_error")}, indent=1))


if __name__ == "__main__":
    main()
