"""Multicast planner speed (issue 12, item 7): seconds to plan N nodes x 64 blocks.

For every strategy and N in NODE_COUNTS (B = 64, K = 1, uniform 100 Gbit/s links,
100 MB blocks), a fresh Python process runs `plan_scale_out` end to end (plan +
pipelines + timeline), then the three parts once more, timed one by one (plan_multicast,
plan_pipelines, simulate; the collector paused as in `plan_scale_out`). Wall and CPU
seconds are both kept: on a shared machine the CPU seconds are the steadier number.

With --old REV the same requests also run on the planner of git revision REV (its
`surge/` package unpacked into a temporary folder), end to end, up to --old-max-nodes
and --old-timeout-s seconds a request, for the speed-up measured in the same run.

Writes benchmarks/results/scaleout/planner_speed.json.
Usage: python -m benchmarks.scaleout.planner_speed [--old REV] [--old-max-nodes 1024]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from surge.policy.multicast.scale_out import MAX_BLOCK_TRANSFERS, MAX_BLOCKS, MAX_NODES, STRATEGIES

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "scaleout" / "planner_speed.json"
NODE_COUNTS = (64, 256, 1024, 4096, 16384)
NUM_BLOCKS = 64
NUM_SOURCES = 1
TARGETS_S = {1024: 1.0, 16384: 10.0}
"""Issue 12: end-to-end seconds each size must stay under (binomial, the default)."""

# Runs in a child process whose working folder holds the `surge` package to time.
_CHILD = """
import gc, json, sys, time
from surge.policy.multicast.scale_out import (
    MulticastRequest, plan_multicast, plan_pipelines, plan_scale_out)
from surge.policy.multicast.timing import simulate
nodes, blocks, sources, strategy, parts = json.loads(sys.argv[1])
request = MulticastRequest(nodes, blocks, sources, strategy)
row = {}
wall, cpu = time.perf_counter(), time.process_time()
outcome = plan_scale_out(request)
row["end_to_end_wall_s"] = time.perf_counter() - wall
row["end_to_end_cpu_s"] = time.process_time() - cpu
row["complete_step"] = outcome.plan.complete_step
row["num_pipelines"] = len(outcome.pipelines)
row["complete_s"] = outcome.timeline.complete_s
del outcome
if parts:
    gc.collect()
    gc.disable()
    for name, run in (
        ("plan", lambda: plan_multicast(request)),
        ("pipelines", lambda: plan_pipelines(plan, request.pipelines)),
        ("timeline", lambda: simulate(plan, pipelines, request.timing)),
    ):
        wall, cpu = time.perf_counter(), time.process_time()
        result = run()
        row[name + "_wall_s"] = time.perf_counter() - wall
        row[name + "_cpu_s"] = time.process_time() - cpu
        if name == "plan":
            plan = result
        elif name == "pipelines":
            pipelines = result
print(json.dumps(row))
"""


def run_case(
    folder: Path, nodes: int, strategy: str, parts: bool, timeout_s: float | None
) -> dict | None:
    """One request in a fresh process with `folder` as its working folder; None on timeout."""
    args = json.dumps([nodes, NUM_BLOCKS, NUM_SOURCES, strategy, parts])
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, args],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
    except subprocess.TimeoutExpired:
        return None
    return json.loads(done.stdout)


def unpack_old(revision: str, into: Path) -> str:
    """Unpack `surge/` of `revision` into `into`; return the full commit id."""
    commit = subprocess.run(
        ["git", "rev-parse", revision], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", commit, "surge"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="git revision of the planner to compare with")
    parser.add_argument("--old-max-nodes", type=int, default=1024)
    parser.add_argument("--old-timeout-s", type=float, default=300.0)
    parser.add_argument("--nodes", type=int, nargs="*", default=list(NODE_COUNTS))
    args = parser.parse_args()
    info = machine()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        old_commit = unpack_old(args.old, Path(tmp)) if args.old else None
        for strategy in STRATEGIES:
            for nodes in args.nodes:
                row = {"strategy": strategy, "nodes": nodes, "blocks": NUM_BLOCKS}
                row["block_transfers"] = (nodes - NUM_SOURCES) * NUM_BLOCKS
                row.update(run_case(ROOT, nodes, strategy, True, None) or {})
                if old_commit and nodes <= args.old_max_nodes:
                    old = run_case(Path(tmp), nodes, strategy, False, args.old_timeout_s)
                    row["old_end_to_end_wall_s"] = old and old["end_to_end_wall_s"]
                    row["old_end_to_end_cpu_s"] = old and old["end_to_end_cpu_s"]
                    if old is None:
                        row["old_timed_out_after_s"] = args.old_timeout_s
                    else:
                        row["speedup_cpu"] = old["end_to_end_cpu_s"] / row["end_to_end_cpu_s"]
                        assert old["complete_step"] == row["complete_step"], row
                        assert old["num_pipelines"] == row["num_pipelines"], row
                rows.append(row)
                print(
                    f"{strategy:12s} N={nodes:6d}  end-to-end {row['end_to_end_wall_s']:6.2f} s "
                    f"wall {row['end_to_end_cpu_s']:6.2f} s cpu  (plan "
                    f"{row['plan_cpu_s']:.2f} / pipelines {row['pipelines_cpu_s']:.2f} / "
                    f"timeline {row['timeline_cpu_s']:.2f} s cpu)"
                    + (
                        f"  old {row['old_end_to_end_cpu_s']:.2f} s cpu"
                        if row.get("speedup_cpu")
                        else ""
                    ),
                    flush=True,
                )
    info["load_average_at_end"] = os.getloadavg()
    report = {
        "benchmark": "planner_speed",
        "machine": info,
        "settings": {
            "node_counts": args.nodes,
            "blocks": NUM_BLOCKS,
            "sources": NUM_SOURCES,
            "strategies": STRATEGIES,
            "links": "uniform 100 Gbit/s (MulticastRequest default), 100 MB blocks",
            "pipelines": "default PipelineSettings (no stage limit, 5000 search states)",
            "timing": "each request in a fresh process; end_to_end = plan_scale_out; "
            "plan/pipelines/timeline = plan_multicast / plan_pipelines / simulate run "
            "again one by one with the cyclic collector paused (as plan_scale_out does)",
            "targets_s": TARGETS_S,
            "limits": {
                "max_nodes": MAX_NODES,
                "max_blocks": MAX_BLOCKS,
                "max_block_transfers": MAX_BLOCK_TRANSFERS,
            },
            "old_revision": old_commit,
            "old_max_nodes": args.old_max_nodes if old_commit else None,
        },
        "results": rows,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=1))
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
