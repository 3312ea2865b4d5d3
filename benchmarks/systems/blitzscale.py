"""BlitzScale in `surge serve` (issue 17): a burst from the Azure conversation trace on a P/D
deployment, four systems in the same run.

Each system runs the same requests on a fresh `LocalCluster` of `--nodes` agents (links
capped at `--link-gbps`, the registry read at `--disk-gbps` as each node's disk) behind the
real controller (`control/`: autoscaler, P/D hand-off and mutation, scale-outs):
- `blitzscale`: chains from the serving instances, live scaling when the TTFT SLO needs it
  (measured Time_l, zigzag or best effort, redistribution), P/D with mutation; scaled, as
  every system here, on requests in flight (`--target`, `count_in_flight`);
- `blitzscale_monitor`: the same, scaled by BlitzScale's own §5.3 load monitor alone (its
  default in `surge serve`: prompt tokens waiting over the TTFT SLO, tokens/s and KV use
  against per-instance bounds "profiled offline"; requests in flight size nothing);
- `lambdascale`: binomial multicast, execution pipelines, mode switch (P/D by the spec);
- `load_then_serve` (ServerlessLLM): each new node loads the whole model from its own tier
  (host cache, else disk), then serves;
- `all_cached`: every node already holds the model and serves from the start (no scaling:
  the lower bound on latency, the upper bound on GPU-seconds).
Both blitzscale systems' monitors are sized as `surge serve` sizes them once its engine step
profile is kept (`blitzscale_bounds.py`): `surge model profile STORE` is run ahead of the
timed part into `--profile-dir` (default: the run's temporary directory, so measured then),
each controller reads it as serve does, and the run starts once it has. `--estimates`: the
condition before the profile (no profile directory: the host's estimates); `--compare`: both,
alternating, the estimate runs named `NAME@estimates`. Each run records the bounds it was
sized by (`bounds`: source and values).
The deployment starts with `pd: {prefill: 1, decode: 1}` (two instances) and may grow to
every node. Requests: `--requests` consecutive requests of
`../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv` (`surge.traces`), their
gaps divided by `--time-scale` (a burst), prompt and output lengths clipped to the tiny
model. Reported per system: TTFT p50/p90/p99 and TBT p50/p99 of the requests served (the
controller's clock; a request held past the deployment's `hold_timeout_s` ends unserved, HTTP 503 in
`surge serve`, and is counted as `unserved`), GPU-seconds
(instances held × seconds, sampled every 0.1 s from the burst to its last token), live
batches / hand-offs / mutations, the P/D roles at the end, the CPU seconds the controller
process and each agent used over the burst (`burst_cpu_s`: on the 2 shared cores, a system
whose requests all decode on one instance is as fast as that agent's steps), and each
one's ratio to blitzscale.

Run: `python -m benchmarks.systems.blitzscale [--nodes 4 --requests 48 --time-scale 20]
[--compare | --estimates]`; writes
benchmarks/results/systems/blitzscale.json and a PNG of the TTFT CDFs.
"""

import argparse
import asyncio
import json
import logging
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.common import cpu_s, model_config
from benchmarks.scaleout.burst_run import percentile
from benchmarks.systems.blitzscale_bounds import bounds_used, take_profile, wait_for_profile
from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.model.importer import import_checkpoint
from surge.model.tiny import create_tiny_model
from surge.policy.systems import system_config
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.traces.resolve import load_trace

log = logging.getLogger("blitzscale")
MODEL = "conv"
SYSTEMS = {
    "blitzscale": "blitzscale",
    "blitzscale_monitor": "blitzscale",
    "lambdascale": "lambdascale",
    "load_then_serve": "serverlessllm",
    "all_cached": "serverlessllm",
}
"""Benchmark name -> the deployment's strategy."""


ESTIMATES = "@estimates"
"""A `--compare` run's name suffix: the monitor's bounds from the host's estimates."""
RATIOS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tbt_p50_s", "tbt_p99_s", "gpu_s")


def plan(names: list[str], args) -> list[tuple[str, str, bool]]:
    """(run name, system, bounds from the profile) in the order run: with `--compare` each
    system whose monitor profiles bounds runs twice, the conditions alternating between
    systems (profile first, then estimates first) so neither always runs second."""
    runs: list[tuple[str, str, bool]] = []
    for name in names:
        bounded = system_config(SYSTEMS[name]).autoscale.profile_bounds
        if not (args.compare and bounded):
            runs.append((name, name, not args.estimates))
            continue
        pair = [(name, name, True), (name + ESTIMATES, name, False)]
        runs += pair if sum(r[0] != r[1] for r in runs) % 2 == 0 else pair[::-1]
    return runs


def burst_from_trace(args) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, output tokens) of the replayed slice."""
    trace = load_trace("azure-conv")
    start = args.offset
    sl = slice(start, start + args.requests)
    arrivals = trace.arrival_s[sl] - trace.arrival_s[start]
    prompts = np.clip(trace.input_tokens[sl], 4, args.max_prompt)
    outputs = np.clip(trace.output_tokens[sl], 2, args.max_tokens)
    return [
        (float(a) / args.time_scale, int(p), int(o))
        for a, p, o in zip(arrivals, prompts, outputs, strict=True)
    ]


async def run_system(
    name: str, store: Path, state: Path, cluster, burst, args, kept: dict | None
) -> dict:
    """One system's burst; its monitor's bounds from the profile `kept` in
    `args.profile_dir` (None: the host's estimates)."""
    profiles = args.profile_dir if kept is not None else None
    cfg = ControllerConfig(
        state_dir=state,
        nodes=args.nodes,
        max_num_seqs=args.max_num_seqs,
        step_profile_dir=profiles,  # as `surge serve` sets it for its local agents
    )
    ctl = Controller(cfg, cluster.addresses, cluster.token)
    await ctl.start()
    try:
        whole = name == "all_cached"
        scaling = {
            "min_replicas": args.nodes if whole else 2,
            "max_replicas": args.nodes,
            "target_ongoing_requests": args.target,
            # every system scales on the same in-flight target (`--target`) but
            # `blitzscale_monitor`: BlitzScale's own §5.3 monitor alone (its default), which
            # counts prompt tokens, generated tokens/s and KV use, not requests
            "count_in_flight": name != "blitzscale_monitor",
            "keep_alive_s": 60,
            "downscale_delay_s": 60,
        }
        dep = await ctl.create(
            {
                "name": MODEL,
                "model": str(store),
                "strategy": SYSTEMS[name],
                "pd": {"prefill": 1, "decode": 1},
                "slo": {"ttft_ms": args.ttft_slo_ms},
                "autoscaling": scaling,
            }
        )
        waited_s = None
        if profiles is not None and dep.spec.autoscaling.profile_bounds:
            # serve's controller reads the kept profile in a child process: measured from
            # when it has, as a user's deployment runs once its profile is there
            waited_s = await wait_for_profile(dep, kept, profiles, name)
        want = scaling["min_replicas"]
        deadline = time.monotonic() + 300
        while len(dep.serving()) < want or dep.multicasting:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {want} first instances never served")
            await asyncio.sleep(0.05)
        bounds = bounds_used(ctl, dep)
        if waited_s is not None:
            bounds["profile_read_after_s"] = round(waited_s, 2)
        load_start = [round(x, 2) for x in os.getloadavg()]
        pids = {node: proc.pid for node, proc in cluster.procs.items()}
        cpu_start = (time.process_time(), cpu_s(pids))
        rng = random.Random(0)
        held: list[tuple[float, int]] = []
        start = time.monotonic()

        async def sample() -> None:
            while True:
                held.append((time.monotonic() - start, len(dep.instances)))
                await asyncio.sleep(0.1)

        sampler = asyncio.get_running_loop().create_task(sample())
        reqs = []
        for at_s, prompt, out in burst:
            delay = start + at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            ids = [rng.randrange(2, 500) for _ in range(prompt)]
            params = SamplingParams(max_tokens=out, ignore_eos=True)
            reqs.append(await ctl.submit(dep, ids, params))
        await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs)), 600)
        sampler.cancel()
        cpu_end = (time.process_time(), cpu_s(pids))
        end_s = max(r.done_t for r in reqs) - start
        gpu_s = sum(0.1 * n for t, n in held if t <= end_s)
        # a request held past the deployment's hold_timeout_s ends without a first token
        # (HTTP 503 in `surge serve`): counted, not timed
        served = [r for r in reqs if r.first_token_t is not None]
        ttft = [r.first_token_t - r.arrival_t for r in served]
        tbt = [
            b - a
            for r in served
            for a, b in zip(r.token_times[:-1], r.token_times[1:], strict=True)
        ]
        pd = dep.server.pd
        status = ctl.describe(dep)["status"]
        return {
            "strategy": SYSTEMS[name],
            "ttft_p50_s": round(percentile(ttft, 0.5), 4),
            "ttft_p90_s": round(percentile(ttft, 0.9), 4),
            "ttft_p99_s": round(percentile(ttft, 0.99), 4),
            "tbt_p50_s": round(percentile(tbt, 0.5), 5),
            "tbt_p99_s": round(percentile(tbt, 0.99), 5),
            "gpu_s": round(gpu_s, 2),
            "all_done_s": round(end_s, 3),
            "unserved": len(reqs) - len(served),
            "max_instances": max(n for _, n in held),
            "live_prefilled": status.get("live_prefilled", 0),
            "handoffs": pd.num_handoffs if pd else 0,
            "mutations": pd.num_mutations if pd else 0,
            "bounds": bounds,
            "bounds_at_end": bounds_used(ctl, dep)["source"],
            "load_average": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
            # where the burst's CPU went (2 shared cores): a system whose decode is one
            # instance's is as fast as that agent's steps, i.e. as the machine's load lets it
            "roles_at_end": dict(sorted(Counter(pd.roles.values()).items())) if pd else {},
            "burst_cpu_s": burst_cpu(cpu_start, cpu_end),
            "ttfts_s": sorted(round(x, 4) for x in ttft),
        }
    finally:
        await ctl.stop()


def burst_cpu(
    start: tuple[float, dict[int, float]], end: tuple[float, dict[int, float]]
) -> dict[str, float]:
    """CPU seconds from the burst's start to its last token: this process's (the
    controller and the load client) and each agent's, by node."""
    out = {"controller": round(end[0] - start[0], 2)}
    out |= {f"node{n}": round(end[1][n] - start[1][n], 2) for n in sorted(end[1]) if n in start[1]}
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, res in report["systems"].items():
        xs = res["ttfts_s"]
        ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"Azure conv burst, {report['requests']} requests, {report['nodes']} nodes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--offset", type=int, default=0, help="first trace row replayed")
    ap.add_argument("--time-scale", type=float, default=20.0, help="trace gaps divided by this")
    ap.add_argument("--max-prompt", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--model-mb", type=float, default=32)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--link-gbps", type=float, default=0.25)
    ap.add_argument("--disk-gbps", type=float, default=0.0625)
    ap.add_argument("--max-num-seqs", type=int, default=2)
    ap.add_argument("--target", type=float, default=2.0, help="target_ongoing_requests")
    ap.add_argument("--ttft-slo-ms", type=float, default=500.0)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument(
        "--profile-dir",
        type=Path,
        help="where the engine step profile is kept (default: the run's temporary directory)",
    )
    bounds = ap.add_mutually_exclusive_group()
    bounds.add_argument(
        "--estimates", action="store_true", help="the monitor's bounds from the host's estimates"
    )
    bounds.add_argument("--compare", action="store_true", help="profile and estimates, alternating")
    ap.add_argument("--note", default="", help="the conditions, e.g. a shared machine")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/systems/blitzscale.json"))
    ap.add_argument("--png", type=Path, default=Path("benchmarks/results/systems/blitzscale.png"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = args.systems.split(",")
    if unknown := [n for n in names if n not in SYSTEMS]:
        ap.error(f"unknown system {unknown[0]}; choose from {', '.join(SYSTEMS)}")
    burst = burst_from_trace(args)
    report: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "cluster": "loopback, token buckets",
            "load_average_start": [round(x, 2) for x in os.getloadavg()],
            "note": args.note,
        },
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "png")},
        "nodes": args.nodes,
        "requests": len(burst),
        "trace": "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
        "burst_span_s": round(burst[-1][0], 3),
        "bounds": "estimates" if args.estimates else "profile",
        "systems": {},
    }
    if args.compare:
        report["bounds"] = "profile; NAME@estimates: the host's estimates, alternating"
    runs = plan(names, args)
    import platform

    report["machine"]["platform"] = platform.platform()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        create_tiny_model(tmp / "hf", model_config(args.model_mb, args.blocks))
        store = tmp / "store"
        import_checkpoint(tmp / "hf", store, num_blocks=args.blocks, progress=False)
        kept = None
        if any(profiled for _, _, profiled in runs):
            args.profile_dir = (args.profile_dir or tmp / "profiles").resolve()
            kept = take_profile(store, args.profile_dir, args.max_num_seqs, args.nodes)
            report["step_profile"] = kept
            log.info("step profile (%.1f s): %s", kept["seconds"], kept["cli_says"])
        for key, name, profiled in runs:
            state = tmp / f"state-{key}"
            (state / "registry").mkdir(parents=True)
            cluster = LocalCluster(
                LocalClusterConfig(
                    num_nodes=args.nodes,
                    remote_dir=state / "registry",
                    link_gbps=args.link_gbps,
                    remote_gbps=args.disk_gbps,
                )
            )
            with cluster:
                profile = kept if profiled else None
                res = asyncio.run(run_system(name, store, state, cluster, burst, args, profile))
            report["systems"][key] = res
            log.info("%s: %s", key, {k: v for k, v in res.items() if k != "ttfts_s"})
    base = report["systems"].get("blitzscale")
    if base:
        report["ratios_to_blitzscale"] = {
            n: {k: round(r[k] / base[k], 3) if base[k] else None for k in RATIOS}
            for n, r in report["systems"].items()
        }
    report["profile_over_estimates"] = {
        n: {k: round(r[k] / e[k], 3) if e[k] else None for k in RATIOS}
        for n, r in report["systems"].items()
        if (e := report["systems"].get(f"{n}{ESTIMATES}"))
    }
    report["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.png)
    print(json.dumps(report.get("ratios_to_blitzscale", {}), indent=1))


if __name__ == "__main__":
    main()
