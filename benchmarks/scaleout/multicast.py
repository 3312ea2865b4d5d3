"""Real multicasts through local agents: every strategy, same cluster, same run.

Multicasts a model's real block bytes from 1 source to N-1 nodes through `surge node`
agents whose NICs are capped at --link-gbps (token buckets; with --cluster netns, tc on
each node's veth pair in its own network namespace), once per strategy, and
compares each with the timing model's optimum for the same links and block sizes:
efficiency = optimal_s / complete_s. Writes JSON (and a PNG of block arrivals per node).

Usage: python -m benchmarks.scaleout.multicast --nodes 8 --model-mb 64 --blocks 16 --link-gbps 0.5 \
           --json benchmarks/results/scaleout/multicast.json \
           --png benchmarks/results/scaleout/multicast.png
       python -m benchmarks.scaleout.multicast --cluster netns ... (root; see docs/testbed.md)
"""

import argparse
import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    add_cluster_args,
    cores_during,
    cpu_s,
    machine,
    make_cluster,
    model_config,
    seed_disk,
)
from surge.model.importer import import_checkpoint
from surge.model.manifest import read_manifest
from surge.model.tiny import create_tiny_model
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.scale_out import STRATEGIES, MulticastRequest, plan_scale_out
from surge.policy.multicast.timing import TimingModel, simulate
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.multicast import MulticastExecutor
from surge.runtime.protocol import EvictOp, LoadOp, RegisterOp

log = logging.getLogger("multicast")
MODEL = "bench"


async def run_strategies(
    cluster: LocalCluster, manifest, strategies: list[str], link_gbps: float
) -> dict:
    client = cluster.client()
    await client.connect()
    await cluster.wire_peers(client)
    n, b = cluster.config.num_nodes, manifest.num_blocks
    sizes = tuple(blk.size_bytes for blk in manifest.blocks)
    timing = TimingModel(Cluster.uniform(n, link_gbps), sizes)
    out: dict = {}
    try:
        for i, strategy in enumerate(strategies):
            name = f"{MODEL}{i}"
            # A fresh model name per strategy: every run starts from empty destinations.
            await client.broadcast(RegisterOp(name, manifest))
            await client.call(0, LoadOp(name, tuple(range(b)), tier="host", source="disk"))
            planned = plan_scale_out(MulticastRequest(num_nodes=n, num_blocks=b, strategy=strategy))
            predicted = simulate(planned.plan, planned.pipelines, timing)
            pids = {node: proc.pid for node, proc in getattr(cluster, "procs", {}).items()}
            before = (time.process_time(), cpu_s(pids))
            t = time.perf_counter()
            result = await MulticastExecutor(
                client, name, planned.plan, tier="host", pipelines=planned.pipelines, timeout_s=600
            ).run()
            wall = time.perf_counter() - t
            cores = cores_during(before, (time.process_time(), cpu_s(pids)), wall)
            if result.complete_s is None:
                raise RuntimeError(f"{strategy}: multicast did not complete")
            out[strategy] = {
                "complete_s": round(result.complete_s, 4),
                "optimal_s": round(predicted.optimal_s, 4),
                "efficiency": round(predicted.optimal_s / result.complete_s, 4),
                "first_pipeline_s": round(result.first_pipeline_s or 0.0, 4),
                "model_complete_s": round(predicted.complete_s, 4),
                "plan_steps": planned.plan.complete_step,
                "wall_s": round(wall, 3),
                # Cores each agent used (framing, checksums, its share of the kernel's TCP
                # work): against a node's quota, whether the multicast was CPU-bound.
                "cores_during": cores,
                "arrival_s": result.arrival_s,
            }
            log.info(
                "%s: %.3f s (optimal %.3f s, efficiency %.2f, timing model %.3f s)",
                strategy,
                result.complete_s,
                predicted.optimal_s,
                predicted.optimal_s / result.complete_s,
                predicted.complete_s,
            )
            await client.broadcast(EvictOp(name, tuple(range(b)), tier="host"))
    finally:
        await client.close()
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = list(report["strategies"])
    fig, grid = plt.subplots(
        1, len(strategies), figsize=(4 * len(strategies), 3.6), sharey=True, squeeze=False
    )
    axes = grid[0]
    for ax, name in zip(axes, strategies, strict=True):
        arrival = report["strategies"][name]["arrival_s"]
        for node, row in enumerate(arrival):
            ax.scatter(row, [node] * len(row), c=range(len(row)), cmap="viridis", s=14)
        s = report["strategies"][name]
        ax.set_title(f"{name}\n{s['complete_s']:.2f} s (eff. {s['efficiency']:.2f})")
        ax.axvline(s["optimal_s"], color="grey", ls="--", lw=0.8)
        ax.set_xlabel("block arrival (s)")
    axes[0].set_ylabel("node")
    fig.suptitle(
        f"{report['nodes']} agents, {report['model_bytes'] / 1e6:.0f} MB in {report['blocks']} "
        f"blocks, {report['link_gbps']} Gbit/s links, {report['machine']['cluster']} "
        "(dashed: optimum)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--model-mb", type=float, default=64)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--link-gbps", type=float, default=0.5)
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/results/scaleout/multicast.json"))
    ap.add_argument("--png", type=Path, default=None)
    add_cluster_args(ap)
    ap.add_argument(
        "--compare-loopback",
        action="store_true",
        help="with --cluster netns: run the same multicasts on loopback agents too",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    strategies = args.strategies.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # Four layers per block so byte balancing can even out embeddings and head.
        create_tiny_model(tmp / "hf", model_config(args.model_mb, 4 * args.blocks))
        import_checkpoint(tmp / "hf", tmp / "store", num_blocks=args.blocks, progress=False)
        manifest = read_manifest(tmp / "store")
        cluster = make_cluster(
            args, num_nodes=args.nodes, link_gbps=args.link_gbps, preload_engine=False
        )
        with cluster:
            # The source's disk tier holds the model (disk reads are not capped).
            for i in range(len(strategies)):
                seed_disk(cluster, 0, f"{MODEL}{i}", tmp / "store", manifest)
            results = asyncio.run(run_strategies(cluster, manifest, strategies, args.link_gbps))
        loopback = None
        if args.compare_loopback and args.cluster != "loopback":
            # The same multicasts on loopback agents right after: a same-run reference.
            ref = LocalCluster(
                LocalClusterConfig(
                    num_nodes=args.nodes, link_gbps=args.link_gbps, preload_engine=False
                )
            )
            with ref:
                for i in range(len(strategies)):
                    seed_disk(ref, 0, f"{MODEL}{i}", tmp / "store", manifest)
                loopback = asyncio.run(run_strategies(ref, manifest, strategies, args.link_gbps))
    report = {
        "nodes": args.nodes,
        "blocks": manifest.num_blocks,
        "model_bytes": manifest.total_bytes,
        "link_gbps": args.link_gbps,
        "strategies": results,
        "machine": machine(args, cluster),
        "loopback_same_run": {
            k: {f: v[f] for f in ("complete_s", "optimal_s", "efficiency")}
            for k, v in loopback.items()
        }
        if loopback
        else None,
        "goals": {"binomial_efficiency": 0.85, "binomial_vs_naive_speedup": 3.0},
        "binomial_vs_naive_speedup": round(
            results["naive"]["complete_s"] / results["binomial"]["complete_s"], 3
        )
        if {"naive", "binomial"} <= set(results)
        else None,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.png:
        plot(report, args.png)
    summary = {
        k: {f: v[f] for f in ("complete_s", "optimal_s", "efficiency", "first_pipeline_s")}
        for k, v in results.items()
    }
    print(
        json.dumps(
            {
                **{
                    k: report[k]
                    for k in (
                        "nodes",
                        "blocks",
                        "model_bytes",
                        "link_gbps",
                        "binomial_vs_naive_speedup",
                    )
                },
                "strategies": summary,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
