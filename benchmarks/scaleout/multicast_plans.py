"""Multicast strategies compared in seconds, as ratios to the optimum.

Plans every strategy (binomial, chain, binary-tree, naive) over a grid of N, B, K and
two link profiles (uniform, heterogeneous), runs each plan through the timing model
and reports two ratios per plan:
- complete: completion time / lower bound on any plan's completion time;
- first: time to the first new serving capacity (first execution pipeline, or first
  destination holding the whole model) / lower bound on it (ceil(B/K) source sends).
A ratio of 1.0 means optimal; the lower bounds are from `surge.policy.multicast.timing`.
Everything is deterministic (the heterogeneous links come from a seeded generator),
so the numbers are exact properties of the plans, not measurements.

Writes benchmarks/results/scaleout/multicast_plans.json and .png.
Usage: python benchmarks/scaleout/multicast_plans.py
"""

import json
import math
import random
import statistics
import time
from pathlib import Path

from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.scale_out import STRATEGIES, MulticastRequest, plan_scale_out

RESULTS = Path(__file__).resolve().parents[1] / "results" / "scaleout"
NODE_COUNTS = (4, 8, 12, 16, 32, 64)
BLOCK_COUNTS = (8, 32, 64)
SOURCE_COUNTS = (1, 4)
MODEL_BYTES = 13_476_839_424  # Llama-2 7B in fp16
UNIFORM_GBPS = 100.0
HETEROGENEOUS_GBPS = (25.0, 50.0, 100.0, 200.0)
HETEROGENEOUS_SEED = 0
TRANSFER_OVERHEAD_S = 50e-6
PLOT_BLOCKS = 32
PLOT_SOURCES = 1


def links(profile: str, num_nodes: int) -> Cluster:
    """Uniform links, or per-node links drawn (seeded) from HETEROGENEOUS_GBPS."""
    if profile == "uniform":
        return Cluster.uniform(num_nodes, UNIFORM_GBPS)
    rng = random.Random(f"{HETEROGENEOUS_SEED}-{num_nodes}")
    return Cluster.symmetric([rng.choice(HETEROGENEOUS_GBPS) for _ in range(num_nodes)])


def run_grid() -> list[dict]:
    rows = []
    for profile in ("uniform", "heterogeneous"):
        for num_nodes in NODE_COUNTS:
            cluster = links(profile, num_nodes)
            for num_blocks in BLOCK_COUNTS:
                for num_sources in SOURCE_COUNTS:
                    if num_sources >= num_nodes:
                        continue
                    for strategy in STRATEGIES:
                        request = MulticastRequest(
                            num_nodes=num_nodes,
                            num_blocks=num_blocks,
                            num_sources=num_sources,
                            strategy=strategy,
                            cluster=cluster,
                            block_bytes=-(-MODEL_BYTES // num_blocks),
                            transfer_overhead_s=TRANSFER_OVERHEAD_S,
                        )
                        outcome = plan_scale_out(request)
                        tl = outcome.timeline
                        rows.append(
                            {
                                "links": profile,
                                "nodes": num_nodes,
                                "blocks": num_blocks,
                                "sources": num_sources,
                                "strategy": strategy,
                                "complete_step": outcome.plan.complete_step,
                                "complete_s": tl.complete_s,
                                "optimal_s": tl.optimal_s,
                                "complete_ratio": tl.complete_s / tl.optimal_s,
                                "first_pipeline_s": tl.first_pipeline_s,
                                "optimal_first_pipeline_s": tl.optimal_first_pipeline_s,
                                "first_ratio": tl.first_pipeline_s / tl.optimal_first_pipeline_s,
                                "num_pipelines": len(outcome.pipelines),
                            }
                        )
    return rows


def summarize(rows: list[dict]) -> dict:
    """Geometric mean and worst ratio per links profile, sources and strategy."""
    summary: dict = {}
    for profile in ("uniform", "heterogeneous"):
        for num_sources in SOURCE_COUNTS:
            key = f"{profile}/K={num_sources}"
            summary[key] = {}
            for strategy in STRATEGIES:
                picked = [
                    r
                    for r in rows
                    if r["links"] == profile
                    and r["sources"] == num_sources
                    and r["strategy"] == strategy
                ]
                summary[key][strategy] = {
                    metric: {
                        "geomean": math.exp(statistics.fmean(math.log(r[metric]) for r in picked)),
                        "worst": max(r[metric] for r in picked),
                    }
                    for metric in ("complete_ratio", "first_ratio")
                }
    return summary


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for col, profile in enumerate(("uniform", "heterogeneous")):
        for row, (metric, label) in enumerate(
            (
                ("complete_ratio", "completion / optimum"),
                ("first_ratio", "first capacity / optimum"),
            )
        ):
            ax = axes[row][col]
            for strategy in STRATEGIES:
                picked = sorted(
                    (r["nodes"], r[metric])
                    for r in rows
                    if r["links"] == profile
                    and r["strategy"] == strategy
                    and r["blocks"] == PLOT_BLOCKS
                    and r["sources"] == PLOT_SOURCES
                )
                ax.plot(*zip(*picked, strict=True), marker="o", label=strategy)
            ax.set_yscale("log")
            ax.set_title(f"{profile} links, B={PLOT_BLOCKS}, K={PLOT_SOURCES}", fontsize=9)
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
            if row == 1:
                ax.set_xlabel("nodes N")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Multicast plans vs lower bounds (1.0 = optimal), timing model in seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    started = time.perf_counter()
    rows = run_grid()
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "multicast_plans",
        "settings": {
            "node_counts": NODE_COUNTS,
            "block_counts": BLOCK_COUNTS,
            "source_counts": SOURCE_COUNTS,
            "strategies": STRATEGIES,
            "model_bytes": MODEL_BYTES,
            "block_bytes": "ceil(model_bytes / blocks)",
            "uniform_gbps": UNIFORM_GBPS,
            "heterogeneous_gbps_choices": HETEROGENEOUS_GBPS,
            "heterogeneous": "node i sends and receives at a seeded random choice "
            f"(random.Random('{HETEROGENEOUS_SEED}-<N>'))",
            "transfer_overhead_s": TRANSFER_OVERHEAD_S,
            "timing": "self-timed: a transfer starts when the block is at the sender and both "
            "ports are free; takes overhead + bits / min(egress, ingress)",
            "complete_ratio": "complete_s / lower bound on any plan "
            "(timing.complete_lower_bound_s)",
            "first_ratio": "first serving capacity (pipeline or whole node) / lower bound "
            "(timing.first_capacity_lower_bound_s)",
            "pipelines": "binomial with K > 1: λScale Alg. 2; otherwise earliest greedy covers",
        },
        "summary": summarize(rows),
        "results": rows,
        "elapsed_s": time.perf_counter() - started,
    }
    (RESULTS / "multicast_plans.json").write_text(json.dumps(report, indent=1))
    plot(rows, RESULTS / "multicast_plans.png")
    for key, per_strategy in report["summary"].items():
        cells = "  ".join(
            f"{s}: {v['complete_ratio']['geomean']:.2f}/{v['first_ratio']['geomean']:.2f}"
            for s, v in per_strategy.items()
        )
        print(f"{key:22s} complete/first geomean ratios  {cells}")


if __name__ == "__main__":
    main()
