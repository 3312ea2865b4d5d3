"""λScale Fig. 12 on the emulated runtime: one warm instance, 50 requests at once, scaled out
by λScale vs NCCL vs FaaSNet vs ServerlessLLM-SSD, beside the simulator. Labelled emulated.

λScale §7.3 Fig. 12 (Llama-2 13B, Testbed1, 12 nodes): λScale serves all 50 requests in
about 1.1 s; FaaSNet takes 2x, NCCL 1.4x, ServerlessLLM-SSD 8x. Each system here runs the
same burst on a fresh cluster of agents emulating `--emulate PRESET:MODEL` at
`--time-dilation D` (docs/emulation.md), through the runtime's own scale-out
(`runtime/scaleout/run.py`) with the system's `SystemConfig` (decisions in `policy/`):
- `lambdascale`: λScale's binomial multicast, serving while loading (execution pipelines,
  mode switch; §4.2-§4.4);
- `nccl`: a real `torch.distributed` gloo process group (`runtime/collective.py`) among
  the warm instance's agent and the targets, created for the scale-out (its creation paced
  to last at least the simulator's `group_setup_s`, `NCCL_GROUP_SETUP_S` = 0.1 emulated s:
  BlitzScale §5) and destroyed after, moving the blocks in NCCL's broadcast algorithm, a
  block-pipelined ring (gloo's send/recv) over the agents' shaped links; serving once
  whole. Needs `--cluster netns`: there the kernel shapes gloo's sockets like the agents'
  own (loopback agents pace only their own transport, so they refuse a group);
- `faasnet`: FaaSNet's binary tree, block-pipelined (λScale §7.5's baseline), serving once
  whole;
- `nccl-tree`: the same group with gloo's own broadcast collective (a binomial tree per
  block, whose root sends every block ceil(log2 N) times) instead of NCCL's ring: a
  counterfactual, not one of the paper's bars;
- `serverlessllm-ssd`: every new node loads the model from its own disk (staged before the
  clock starts) at the preset's SSD rate, starts its engine (`init_s`, the shipped 0.5 s)
  and serves alone.
The serving clock is the emulation's (an emulated second lasts D real ones), so every time
is in emulated seconds. Beside each: the simulator on the same preset (its first `--nodes`
GPUs), model, burst and system (`sim_calibrate.predict.simulate_burst`, no host contention),
and the paper's ratios. The figure's number: the time until every request has its first
token (`ttft_max_s`). On `--cluster netns` each run also records the bytes the kernel let
through every node's link (`links`), and a gloo run the rate the root's egress achieved
against its cap (`group.root_egress_gbps`, `group.cap_gbps`).

Usage (one sitting per system, `--resume` adds to the JSON; a system may run at its own D,
each run records its own):
    python -m benchmarks.emulation.lambdascale_fig12 --systems lambdascale \\
        --json benchmarks/results/emulation/emulation_lambdascale_fig12.json
    python -m benchmarks.emulation.lambdascale_fig12 --systems faasnet --resume ...
    python -m benchmarks.emulation.lambdascale_fig12 --systems nccl --cluster netns --resume ...
    python -m benchmarks.emulation.lambdascale_fig12 --systems serverlessllm-ssd \\
        --time-dilation 40 --resume ...   # its disk load is ~7 real min at D = 80
"""

import argparse
import asyncio
import json
import logging
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import add_cluster_args, code_version, machine
from benchmarks.emulation.agents import real_model, shrunk_cluster, violations
from benchmarks.emulation.staging import emulated_cluster, stage
from benchmarks.scaleout.burst_run import LOAD_THEN_SERVE, MODEL, burst
from surge.emulation import Emulation, EmulationConfig
from surge.model.manifest import Manifest
from surge.policy.systems import NCCL_GROUP_SETUP_S, SystemConfig, system_config
from surge.runtime.clock import Clock

log = logging.getLogger("emulation_lambdascale_fig12")

SYSTEMS = ("lambdascale", "nccl", "faasnet", "serverlessllm-ssd", "nccl-tree")
"""Fig. 12's four, and `nccl-tree`: the same real gloo group moving the blocks by gloo's
broadcast collective instead of NCCL's ring (not in the paper's figure)."""
PAPER = {
    "lambdascale_all_first_token_s": 1.1,
    "over_lambdascale": {"faasnet": 2.0, "nccl": 1.4, "serverlessllm-ssd": 8.0},
    "source": "λScale §7.3 Fig. 12 (Llama-2 13B, Testbed1, 12 nodes, 1 warm instance, 50 "
    "requests at once): all served in ~1.1 s; FaaSNet 2x, NCCL 1.4x, ServerlessLLM-SSD 8x",
}


def plan_of(name: str) -> tuple[SystemConfig, str, str, str]:
    """(system, burst mode, where new nodes load from, the simulator's base system)."""
    if name == "lambdascale":
        return (
            replace(system_config("lambdascale"), max_sources=1),
            "execute_while_load",
            "remote",
            name,
        )
    if name in ("nccl", "faasnet"):
        return system_config(name), "stop_the_world", "remote", name
    if name == "nccl-tree":
        tree = replace(system_config("nccl"), multicast_transport="gloo")
        return tree, "stop_the_world", "remote", "nccl"
    if name == "serverlessllm-ssd":
        sllm = replace(system_config("serverlessllm"), host_cache="none")
        return sllm, LOAD_THEN_SERVE, "disk", "serverlessllm"
    raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")


def run_emulated(args, tmp: Path, manifest: Manifest, emulation: Emulation, name: str) -> dict:
    """`name`'s burst on a fresh emulated cluster; times in emulated seconds."""
    system, mode, load_from, _ = plan_of(name)
    cluster = emulated_cluster(args, tmp, emulation)
    run_args = argparse.Namespace(**{**vars(args), "sources": 1})
    with cluster:
        staged_s = 0.0
        if load_from == "disk":  # ServerlessLLM's SSD tier holds the model before the burst
            staged_s = asyncio.run(stage(cluster, MODEL, manifest, list(range(1, args.nodes)), []))
        t0 = time.monotonic()
        clock = Clock(args.time_dilation)
        before = link_bytes(cluster)
        res = asyncio.run(
            burst(
                cluster,
                manifest,
                mode,
                run_args,
                "remote",
                system,
                clock,
                load_from,
                paced_setups=True,  # NCCL's communicator: the simulator's 0.1 s
            )
        )
        wall = time.monotonic() - t0
        links = link_bytes(cluster, before)
        steps = asyncio.run(violations(cluster))
    total = sum(s[0] for s in steps.values())
    bad = sum(s[1] for s in steps.values())
    out = {k: v for k, v in res.items() if k not in ("cores_during_burst", "tokens_per_s_timeline")}
    out["emulation"] = {
        "steps": total,
        "violations": bad,
        "violation_rate": round(bad / total, 4) if total else None,
        "real_wall_s": round(wall, 2),
        "staging_real_s": round(staged_s, 2),
        "time_dilation": args.time_dilation,
        "load_average_end": os.getloadavg(),
    }
    out["cluster"] = args.cluster
    out["transport"] = system.multicast_transport  # how its bytes moved (policy/systems.py)
    if links is not None:
        out["links"] = links
        if out.get("group") and out["group"]["broadcast_real_s"]:
            g = out["group"]
            g["cap_gbps"] = cluster.config.caps(0)[0]
            g["root_egress_gbps"] = links["0"][0] * 8 / g["broadcast_real_s"] / 1e9
            g["root_egress_over_cap"] = round(g["root_egress_gbps"] / g["cap_gbps"], 3)
    out["code"] = code_version()
    log.info(
        "emulated %s: all first tokens %.3f s, violations %d/%d",
        name,
        out["ttft_max_s"],
        bad,
        total,
    )
    return out


def link_bytes(cluster, before: dict | None = None) -> dict | None:
    """{node: [egress, ingress] bytes} the kernel let through each shaped link (minus
    `before`'s); None off netns (no kernel links to read)."""
    if not hasattr(cluster, "link_bytes"):
        return None
    now = {str(n): list(cluster.link_bytes(n)) for n in cluster.nets}
    if before is None:
        return now
    return {n: [a - b for a, b in zip(v, before[n], strict=True)] for n, v in now.items()}


def run_simulated(args, emulation: Emulation, name: str) -> dict:
    """The simulator on the same preset (its first `--nodes` GPUs), model, burst, system."""
    from benchmarks.sim_calibrate.predict import simulate_burst

    _, mode, _, base = plan_of(name)
    real = {
        "sources": 1,
        "blocks": args.blocks,
        "requests": args.requests,
        "nodes": args.nodes,
        "max_num_seqs": args.max_num_seqs,
        "prompt_len": list(args.prompt_len),
        "max_tokens": args.max_tokens,
    }
    cluster = shrunk_cluster(emulation.config.preset, args.nodes)
    sim_mode = "execute_while_load" if mode == "execute_while_load" else "stop_the_world"
    return simulate_burst(cluster, emulation.config.model, real, sim_mode, cores=None, base=base)


def summarize(report: dict) -> dict:
    """All-first-token time per system and its ratio to λScale's: emulated, simulated,
    paper; the simulator's error against the emulated runtime."""
    runs = report["systems"]
    out: dict = {"all_first_token_s": {}, "over_lambdascale": {}, "sim_error": {}}
    for body in ("emulated", "simulated"):
        times = {n: r[body]["ttft_max_s"] for n, r in runs.items()}
        out["all_first_token_s"][body] = times
        lam = times.get("lambdascale")
        out["over_lambdascale"][body] = {
            n: round(t / lam, 3) for n, t in times.items() if lam and n != "lambdascale"
        }
    out["over_lambdascale"]["paper"] = PAPER["over_lambdascale"]
    for n, r in runs.items():
        e, s = r["emulated"], r["simulated"]
        out["sim_error"][n] = {
            k: round(s[k] / e[k] - 1, 3) for k in ("ttft_p50_s", "ttft_p90_s", "ttft_max_s") if e[k]
        }
    emu = out["over_lambdascale"]["emulated"]
    order = sorted(emu, key=emu.get)
    out["order_emulated"] = ["lambdascale", *order]
    out["order_paper"] = ["lambdascale", "nccl", "faasnet", "serverlessllm-ssd"]
    out["violation_rate"] = {
        n: r["emulated"]["emulation"]["violation_rate"] for n, r in runs.items()
    }
    out["time_dilation"] = {n: dilation(report, n) for n in runs}
    out["cluster"] = {n: r["emulated"].get("cluster", "loopback") for n, r in runs.items()}
    return out


def dilations(report: dict) -> str:
    """'80' or '80, serverlessllm-ssd at 40': the JSON's D and each run's own where it differs."""
    base = report["time_dilation"]
    own = [f", {n} at {d:g}" for n in report["systems"] if (d := dilation(report, n)) != base]
    return f"{base:g}{''.join(own)}"


def dilation(report: dict, name: str) -> float:
    """The D `name` ran at (runs from before the per-run record ran at the JSON's D)."""
    return report["systems"][name]["emulated"]["emulation"].get(
        "time_dilation", report["time_dilation"]
    )


ALGORITHMS = {"gloo-ring": "NCCL's ring", "gloo": "gloo's binomial-tree broadcast"}
"""How a gloo group's blocks moved, by `multicast_transport`."""


def nccl_note(report: dict) -> str:
    """How the NCCL column was carried out: a real gloo group (its algorithm and measured
    set-up) or, in runs before it, the simulator's chain plus set-up."""
    nccl = report["systems"].get("nccl", {}).get("emulated", {})
    g = nccl.get("group")
    if not g or g.get("fell_back") or g.get("setup_s") is None:
        return "NCCL as chain + group set-up, not gloo"
    how = ALGORITHMS[nccl.get("transport", "gloo")]  # the first gloo runs had no record
    formed = max((t for t in g.get("member_setup_real_s", ()) if t is not None), default=None)
    real = f"; the real group formed in {formed:.2f} s real" if formed is not None else ""
    return (
        f"NCCL as {how} in a real gloo group on netns (group set-up "
        f"{g['setup_s'] * 1000:.1f} ms emulated{real}; sim {NCCL_GROUP_SETUP_S:g} s)"
    )


def report_cell(report: dict) -> list[dict]:
    """REPORT.md's emulated cell for λScale Fig. 12 (`benchmarks/paper/emulated.py`)."""
    s = report["summary"]
    lam = s["all_first_token_s"]["emulated"].get("lambdascale")
    ratios = ", ".join(
        f"{n} {v}x (sim {s['over_lambdascale']['simulated'].get(n)}x)"
        for n, v in s["over_lambdascale"]["emulated"].items()
    )
    text = (
        f"EMULATED ({report['emulate']}, {report['nodes']} agents, dilation "
        f"{dilations(report)}, {report['requests']} requests): all first tokens "
        f"λScale {lam} s; {ratios}; {nccl_note(report)}"
    )
    missing = [n for n in SYSTEMS[:4] if n not in report["systems"]]  # the paper's four
    if missing:
        text += f"; not run: {', '.join(missing)}"
    return [{"paper": "λScale", "figure": "Fig. 12", "emulated": text}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--blocks", type=int, default=16, help="λScale's block count (systems.py)")
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(4, 12), metavar=("MIN", "MAX"))
    ap.add_argument("--max-num-seqs", type=int, default=4, help="batch limit per instance")
    ap.add_argument("--bucket-s", type=float, default=0.05, help="timeline bucket, emulated s")
    ap.add_argument(
        "--json",
        type=Path,
        default=Path("benchmarks/results/emulation/emulation_lambdascale_fig12.json"),
    )
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--resume", action="store_true", help="add to --json's systems")
    add_cluster_args(ap)
    ap.set_defaults(emulate="lambdascale-testbed1:llama2-13b", time_dilation=80.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    names = args.systems.split(",")
    for n in names:
        try:
            plan_of(n)
        except ValueError as exc:
            ap.error(f"--systems: {exc}")  # one `error:` line, exit 2
    gloo = [n for n in names if plan_of(n)[0].multicast_transport != "blocks"]
    if gloo and args.cluster != "netns":
        ap.error(f"--systems {','.join(gloo)}: a gloo group's bytes are shaped only on "
                 "--cluster netns (add --cluster netns)")  # fmt: skip
    config = EmulationConfig.parse(args.emulate, args.time_dilation)
    report: dict = {"systems": {}, "time_dilation": args.time_dilation}
    if args.resume and args.json.exists():
        report = json.loads(args.json.read_text())
        if report.get("nodes") != args.nodes or report.get("emulate") != config.spec:
            ap.error("--resume needs the JSON's --nodes and --emulate (or a new --json)")
        # A system may run at its own D (each run records it; times are emulated seconds
        # either way): ServerlessLLM-SSD's disk load is pure pacing, ~7 real min at D = 80.
        # ... and on its own cluster kind (gloo needs netns): runs from before the per-run
        # record ran on the JSON's one
        earlier = report.get("machine", {}).get("cluster", "loopback")
        for run in report["systems"].values():
            run["emulated"].setdefault("cluster", earlier)
    report.update(
        label="EMULATED: real agents paced as the emulated cluster (docs/emulation.md)",
        emulate=config.spec,
        nodes=args.nodes,
        blocks=args.blocks,
        requests=args.requests,
        max_tokens=args.max_tokens,
        prompt_len=list(args.prompt_len),
        max_num_seqs=args.max_num_seqs,
        times="emulated seconds (the serving clock runs D times slower than the host's)",
        paper=PAPER,
        machine=machine(args),
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = real_model(tmp, args.blocks, args.blocks)
        emulation = Emulation.for_store(config, manifest)
        report["real_model_bytes"] = manifest.total_bytes
        for name in names:
            report["systems"][name] = {
                "emulated": run_emulated(args, tmp, manifest, emulation, name),
                "simulated": run_simulated(args, emulation, name),
            }
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1) + "\n")  # after each system
    report["summary"] = summarize(report)
    if "lambdascale" in report["systems"]:
        report["report_emulated"] = report_cell(report)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.png:
        plot(report, args.png)
    print(json.dumps(report["summary"], indent=1))


def plot(report: dict, path: Path) -> None:
    """Time until every request has its first token, per system: emulated, simulated, and
    the paper's (λScale's 1.1 s times its ratios)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["summary"]["all_first_token_s"]
    names = [n for n in SYSTEMS if n in report["systems"]]
    paper = {"lambdascale": 1.0, **PAPER["over_lambdascale"]}
    series = {
        "emulated": [s["emulated"][n] for n in names],
        "simulated": [s["simulated"][n] for n in names],
        "paper": [
            PAPER["lambdascale_all_first_token_s"] * paper.get(n, float("nan")) for n in names
        ],
    }
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.27
    for i, (label, vals) in enumerate(series.items()):
        ax.bar([j + (i - 1) * width for j in range(len(names))], vals, width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("all requests' first token (emulated s)")
    ax.legend()
    ax.set_title(
        f"EMULATED {report['emulate']}, {report['nodes']} agents, D={dilations(report)},\n"
        f"{report['requests']} requests, 1 warm instance (λScale Fig. 12)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
