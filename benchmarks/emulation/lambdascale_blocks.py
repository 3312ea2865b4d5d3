"""λScale Fig. 8, 18 and 17 on the emulated runtime: real agents moving real blocks over the
emulated links, each block's arrival recorded per node, beside the simulator. Labelled emulated.

One run = one isolated scale-out of the model from one warm node (k = 1, λScale §7.6 "We
fix k = 1") to every other of `nodes` agents emulating `--emulate PRESET:MODEL` at
`--time-dilation D` (docs/emulation.md), through the runtime's own scale-out with the
system's `SystemConfig`, stop-the-world (the multicast alone: one request keeps the warm
instance serving, none waits on the new nodes). Each receiver's arrival of every block is
the multicast executor's (`MulticastResult.arrival_s`, `burst_run.block_arrivals`), in
emulated seconds from the scale-out's start (a gloo group's creation included).
- `fig8`: λScale (binomial pipeline), FaaSNet (binary tree) and NCCL (a real gloo group, its
  creation paced to `NCCL_GROUP_SETUP_S`, blocks in ring order; `--cluster netns` only) at
  4, 8 and 12 nodes; the arrivals at node A (the first receiver) and B (the last), as λScale
  Fig. 8 plots them ("We randomly select two nodes (A and B) ... Other nodes show similar
  pattern").
- `fig18`: λScale at 12 nodes with the model cut into B = 8, 16, 24, 32, 48 blocks (the
  real store imported with B equal blocks, so every block is one emulated 1/B of the model);
  the time until every node holds every block.
- `fig17`: one warm node and one receiver, B = 16: each block's transfer over the emulated
  link (the gap between successive arrivals). The runtime has one configuration, all three
  of Fig. 17's optimizations (packed blocks, tier buffers allocated before a pull, received
  where they serve); the others are not switchable, and what they cost is host work, which
  the emulation divides by D.
Beside each run the simulator on the same preset (its first `nodes` GPUs), model, system and
block count (`paper/multicast.isolated_multicast`, the simulator's block-level multicast).
The real store is a tiny Llama of `--layers` (48) layers, so every B cuts the same layers.

Usage (one part per sitting, `--resume` adds to the JSON; see docs/emulation.md):
    python -m benchmarks.emulation.lambdascale_blocks --part fig8 --cluster netns \\
        --nodes-list 4,8 --resume --png PNG
"""

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import add_cluster_args, code_version, machine, make_cluster
from benchmarks.emulation.agents import real_model, violations
from benchmarks.emulation.lambdascale_blocks_cells import plot, report_cells, summarize
from benchmarks.scaleout.burst_run import burst
from surge.emulation import Emulation, EmulationConfig
from surge.policy.systems import SystemConfig, system_config
from surge.runtime.clock import Clock

log = logging.getLogger("emulation_lambdascale_blocks")

PARTS = ("fig8", "fig18", "fig17")
FIG8_SYSTEMS = ("lambdascale", "faasnet", "nccl")
FIG8_NODES = (4, 8, 12)
FIG18_BLOCKS = (8, 16, 24, 32, 48)
"""λScale Fig. 18's block counts (as `paper/lambdascale/lambdascale_figs.fig18`)."""
LAYERS = 48
"""Real layers: every block count of Fig. 18 cuts them evenly."""
RESULT = Path("benchmarks/results/emulation/emulation_lambdascale_blocks.json")


def system_of(name: str, blocks: int) -> SystemConfig:
    """`name`'s system from one source (k = 1) with the model in `blocks` blocks."""
    return replace(system_config(name), max_sources=1, num_blocks=blocks)


def receivers(arrival: list[list[float | None]]) -> dict:
    """What Fig. 8 reads off one run's arrival matrix (plan nodes, the source first): the
    sorted arrivals at A (plan node 1) and B (the last), their first and last block, every
    receiver's last block, and when every node held every block (None: some never did)."""
    got = arrival[1:]
    a, b = (sorted(t for t in row if t is not None) for row in (got[0], got[-1]))
    every = [t for row in got for t in row]
    complete = None if any(t is None for t in every) else max(every)
    return {
        "arrival_s": {"A": a, "B": b},
        "first_s": min(a[0], b[0]) if a and b else None,
        "last_s": max(a[-1], b[-1]) if a and b else None,
        "spread_B_s": round(b[-1] - b[0], 4) if b else None,
        "last_by_node_s": [max((t for t in row if t is not None), default=None) for row in got],
        "complete_s": complete,
    }


def run_emulated(args, name: str, nodes: int, blocks: int) -> dict:
    """One isolated scale-out of `name` to `nodes` agents with the model in `blocks` blocks,
    on a fresh emulated cluster; times in emulated seconds."""
    system = system_of(name, blocks)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = real_model(tmp, args.layers, blocks)
        emulation = Emulation.for_store(
            EmulationConfig.parse(args.emulate, args.time_dilation), manifest
        )
        cluster = make_cluster(
            args,
            num_nodes=nodes,
            max_num_seqs=4,
            remote_dir=tmp / "reg",
            emulation=emulation,
            start_timeout_s=600.0,  # a dozen agents importing torch on two shared cores
        )
        run_args = argparse.Namespace(
            sources=1,
            nodes=nodes,
            requests=1,
            max_tokens=64,  # ~65 paced steps: a warm-up step alone is not 1%
            prompt_len=(4, 8),
            max_num_seqs=4,
            bucket_s=0.05,
        )
        load_start = os.getloadavg()
        with cluster:
            pids = {str(n): proc.pid for n, proc in getattr(cluster, "procs", {}).items()}
            t0 = time.monotonic()
            res = asyncio.run(
                burst(
                    cluster,
                    manifest,
                    "stop_the_world",
                    run_args,
                    "remote",
                    system,
                    Clock(args.time_dilation),
                    paced_setups=True,  # NCCL's communicator: the simulator's 0.1 s
                )
            )
            wall = time.monotonic() - t0
            steps = asyncio.run(violations(cluster))
    total, bad = (sum(s[i] for s in steps.values()) for i in (0, 1))
    out = receivers(res["block_arrival_s"])
    out.update(
        block_arrival_s=res["block_arrival_s"],
        multicast_complete_s=res["multicast_complete_s"],
        group=res["group"],
        real_store_bytes=manifest.total_bytes,
        emulation={
            "time_dilation": args.time_dilation,
            "steps": total,
            "violations": bad,
            "violation_rate": round(bad / total, 4) if total else None,
            "steps_violations_overrun_s_by_node": steps,
            "real_wall_s": round(wall, 2),
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
        },
        cluster=args.cluster,
        machine=machine(args, cluster),  # netns: each agent's CPU share
        agent_pids=pids,  # stopped when the cluster closed
        code=code_version(),
    )
    log.info(
        "emulated %s, %d nodes, %d blocks: first %s s, last %s s, complete %s s, "
        "violations %d/%d, load %.1f -> %.1f",
        name, nodes, blocks, out["first_s"], out["last_s"], out["complete_s"], bad, total,
        load_start[0], out["emulation"]["load_average_end"][0],
    )  # fmt: skip
    return out


def run_simulated(config: EmulationConfig, name: str, nodes: int, blocks: int) -> dict:
    """The simulator's isolated multicast on the same preset, nodes, model, system, blocks."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "paper"))
    from multicast import isolated_multicast

    landed: dict[tuple[int, int], float] = {}
    times = isolated_multicast(
        config.preset, config.model, system_of(name, blocks), nodes, 1, landed
    )
    arrival = [[0.0 if n == 0 else landed.get((n, b)) for b in range(blocks)] for n in range(nodes)]
    out = receivers([[None if t is None else round(t, 4) for t in row] for row in arrival])
    out["multicast_complete_s"] = round(times["complete_s"], 4)
    return out


def run_part(args, part: str, report: dict) -> None:
    """`part`'s runs into `report[part]` (the JSON is written after each)."""
    config = EmulationConfig.parse(args.emulate, args.time_dilation)
    if part == "fig8":
        todo = [(s, n, args.blocks) for n in args.nodes_list for s in args.systems]
    elif part == "fig18":
        todo = [("lambdascale", max(args.nodes_list), b) for b in args.block_counts]
    else:
        todo = [("lambdascale", 2, args.blocks)]
    for name, nodes, blocks in todo:
        key = f"{name}/{nodes}/{blocks}"
        report.setdefault(part, {})[key] = {
            "system": name,
            "nodes": nodes,
            "blocks": blocks,
            "emulated": run_emulated(args, name, nodes, blocks),
            "simulated": run_simulated(config, name, nodes, blocks),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=PARTS, action="append", help="default: all three")
    ap.add_argument("--systems", type=lambda s: s.split(","), default=list(FIG8_SYSTEMS))
    ap.add_argument(
        "--nodes-list", type=lambda s: [int(x) for x in s.split(",")], default=list(FIG8_NODES)
    )
    ap.add_argument(
        "--block-counts",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(FIG18_BLOCKS),
    )
    ap.add_argument("--blocks", type=int, default=16, help="λScale's block count (fig8, fig17)")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--json", type=Path, default=RESULT)
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument("--resume", action="store_true", help="add to --json's runs")
    ap.add_argument(
        "--resummarize", action="store_true", help="only redo --json's summary, cells, --png"
    )
    add_cluster_args(ap)
    ap.set_defaults(emulate="lambdascale-testbed1:llama2-13b", time_dilation=80.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    fig8 = "fig8" in (args.part or PARTS) and not args.resummarize
    if "nccl" in args.systems and args.cluster != "netns" and fig8:
        ap.error("--systems nccl: a gloo group's bytes are shaped only on --cluster netns")
    report: dict = {}
    if args.resummarize:
        args.resume = True  # the runs stay as measured
    if args.resume and args.json.exists():
        report = json.loads(args.json.read_text())
        if report.get("emulate") != args.emulate or report.get("layers") != args.layers:
            ap.error("--resume needs the JSON's --emulate and --layers (or a new --json)")
    report.update(
        label="EMULATED: real agents paced as the emulated cluster (docs/emulation.md)",
        emulate=args.emulate,
        layers=args.layers,
        times="emulated seconds from the scale-out's start (real / time_dilation)",
    )
    if not args.resummarize:
        report["machine"] = machine(args)
    for part in [] if args.resummarize else args.part or PARTS:
        run_part(args, part, report)
    report["summary"] = summarize(report)
    report["report_emulated"] = report_cells(report)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.png:
        plot(report, args.png)
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
