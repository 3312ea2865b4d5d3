"""A burst on one hot instance, scaled out to the other nodes: serve while loading or not.

Same run, two modes over fresh local clusters (`surge node` agents with capped links;
with `--cluster netns` each agent is a node of an emulated cluster: its own network namespace,
tc-shaped links and a CPU quota, so every node brings its own compute; docs/testbed.md):
- `execute_while_load`: execution pipelines open as soon as their members hold their
  stages (λScale §4.3), local instances when a node holds the whole model (mode switch);
- `stop_the_world`: a node serves only once it holds the whole model.
Writes `{"modes": {MODE: {"ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
"tokens_per_s_timeline", "all_requests_done_s", "cores_during_burst"}}}` (+ a PNG of
throughput over time); `cores_during_burst`: the cores the controller process (router,
scale-out, load client) and each agent used from the first request to the last token.

Then ParaServe's cold start (§4): one request for a model that is only in the remote
registry; first-token time when a 4-way pipeline group fetches a quarter each vs one worker
fetching the whole model.

Usage: python -m benchmarks.scaleout.scale_burst --nodes 8 --blocks 16 --link-gbps 0.5 \
           --requests 64 --json benchmarks/results/scaleout/scale_burst.json \
           --png benchmarks/results/scaleout/scale_burst.png
       python -m benchmarks.scaleout.scale_burst --cluster netns --sources 1,2,4 ...
           (one report per K under "by_sources", each with both modes of the same run)
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
    emulation_of,
    machine,
    make_cluster,
    model_config,
    seed_disk,
)
from benchmarks.scaleout.burst_run import (
    LINK_OVER_DISK,
    LOAD_THEN_SERVE,
    MODEL,
    MODES,
    burst,
)
from surge.engine.sampling import SamplingParams
from surge.model.importer import import_checkpoint
from surge.model.manifest import Manifest, read_manifest
from surge.model.tiny import create_tiny_model
from surge.policy.systems import SystemConfig
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.launch.local import LocalCluster
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.protocol import LoadOp, RegisterOp
from surge.runtime.scaleout.local import engine_start
from surge.runtime.server import Server

log = logging.getLogger("scale_burst")


async def cold_start(
    cluster: LocalCluster,
    manifest: Manifest,
    group: int,
    prompt_len: int = 4,
    phases: dict[str, float] | None = None,
    engine: SystemConfig | None = None,
    clock: Clock = REAL_CLOCK,
) -> float:
    """First-token time of one request of `prompt_len` tokens on a model only in the
    registry (ParaServe §4); `phases` (if given) gets when every member had fetched its part,
    when its engine had started and when the endpoint was open, real seconds from the
    request. `engine`: the members then wait for that system's engine start on `clock`, as
    the emulated runtime's scale-outs do (`runtime/scaleout/local.engine_start`)."""
    client = cluster.client()
    await client.connect()
    await cluster.wire_peers(client)
    await client.broadcast(RegisterOp(model=MODEL, manifest=manifest))
    server = Server(client, MODEL)
    b = manifest.num_blocks
    parts = [list(range(i * b // group, (i + 1) * b // group)) for i in range(group)]
    try:
        prompt = [5 + i % 500 for i in range(prompt_len)]
        req = server.new_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
        start, launch_s = time.monotonic(), clock.now_s()
        await server.submit(req)  # queued: nothing serves the model yet
        # Each member fetches only its part first (parallel fetch).
        await asyncio.gather(
            *(
                client.call(
                    node, LoadOp(model=MODEL, blocks=tuple(part), source="remote", tier="gpu")
                )
                for node, part in enumerate(parts)
            )
        )
        if group == 1:
            ep = LocalEndpoint(client, 0, MODEL, "cold-1")
        else:
            blocks = manifest.blocks
            stages = [
                (n, blocks[p[0]].first_layer, blocks[p[-1]].end_layer) for n, p in enumerate(parts)
            ]
            ep = PipelineEndpoint(client, manifest, MODEL, f"cold-{group}", stages)
        fetched = time.monotonic() - start
        if engine is not None:
            await engine_start(clock, engine, launch_s)
        started = time.monotonic() - start
        await ep.open()
        await server.add_endpoint(ep)
        opened = time.monotonic() - start
        if phases is not None:
            phases.update(fetched_s=fetched, engine_started_s=started, endpoint_open_s=opened)
        await asyncio.wait_for(req.done.wait(), 600)
        return req.first_token_t - start
    finally:
        await server.close()
        await client.close()


def _plot_modes(ax, modes: dict) -> None:
    for mode, res in modes.items():
        tl = res["tokens_per_s_timeline"]
        ax.plot(
            [t for t, _ in tl],
            [v for _, v in tl],
            label=f"{mode} (p90 TTFT {res['ttft_p90_s']:.2f} s)",
        )
        if res.get("multicast_complete_s"):
            ax.axvline(res["multicast_complete_s"], ls=":", lw=0.8, color=ax.lines[-1].get_color())
    ax.set_xlabel("time since the burst (s)")
    ax.legend(fontsize=7)


def plot(report: dict, path: Path) -> None:
    """Tokens/s over time during the scale-out (λScale Fig. 9/16 style): one panel per K
    with every mode of that K's run; dotted lines: the multicast completes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report.get("by_sources") or {str(report["sources"]): {"modes": report["modes"]}}
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4), sharey=True, squeeze=False)
    for ax, (k, run) in zip(axes[0], runs.items(), strict=True):
        _plot_modes(ax, run["modes"])
        ax.set_title(f"K={k} hot")
    axes[0][0].set_ylabel("tokens/s")
    fig.suptitle(
        f"Burst of {report['requests']} requests scaled out to {report['nodes']} nodes "
        f"({report['machine'].get('cluster', 'loopback')})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run_modes(args, tmp: Path, manifest: Manifest, sources: int) -> dict:
    """Both modes (same run) with `sources` hot instances; the p90 TTFT ratio between them."""
    out: dict = {"modes": {}}
    args = argparse.Namespace(**{**vars(args), "sources": sources})
    for mode in args.modes.split(","):
        cluster = make_cluster(
            args,
            num_nodes=args.nodes,
            link_gbps=args.link_gbps,
            max_num_seqs=args.max_num_seqs,
            max_kv_tokens=2048,
            remote_dir=tmp / "reg",
            # The registry read cap stands in for each node's own disk (load_then_serve).
            remote_gbps=args.disk_gbps or args.link_gbps / LINK_OVER_DISK,
            fuse_projections=not args.no_fuse_projections,
            emulation=emulation_of(args, manifest),
        )
        with cluster:
            for node in range(sources):
                seed_disk(cluster, node, MODEL, tmp / "reg" / MODEL, manifest)
            out["modes"][mode] = asyncio.run(burst(cluster, manifest, mode, args))
        out["machine"] = machine(args, cluster)
        log.info(
            "K=%d %s: %s",
            sources,
            mode,
            {
                k: v
                for k, v in out["modes"][mode].items()
                if k.startswith(("ttft", "all_", "multicast", "requests_via"))
            },
        )
    if set(MODES) <= set(out["modes"]):
        m = out["modes"]
        out["p90_ttft_speedup"] = round(
            m["stop_the_world"]["ttft_p90_s"] / m["execute_while_load"]["ttft_p90_s"], 3
        )
    if {"execute_while_load", LOAD_THEN_SERVE} <= set(out["modes"]):
        m = out["modes"]
        out["p90_ttft_vs_load_then_serve"] = round(
            m[LOAD_THEN_SERVE]["ttft_p90_s"] / m["execute_while_load"]["ttft_p90_s"], 3
        )
        out["disk_gbps"] = args.disk_gbps or args.link_gbps / LINK_OVER_DISK
    return out


def cold_starts(args, tmp: Path, manifest: Manifest) -> dict:
    """ParaServe §4: first token with 4 workers fetching a quarter each vs 1 fetching all."""
    cold = {}
    for group in (1, 4):
        cluster = make_cluster(
            args, num_nodes=group, remote_dir=tmp / "reg", remote_gbps=args.remote_gbps
        )
        with cluster:
            cold[f"workers_{group}_first_token_s"] = round(
                asyncio.run(cold_start(cluster, manifest, group)), 4
            )
    cold["ratio_1_over_4"] = round(
        cold["workers_1_first_token_s"] / cold["workers_4_first_token_s"], 3
    )
    cold["remote_gbps_per_node"] = args.remote_gbps
    log.info("cold start: %s", cold)
    return cold


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--model-mb", type=float, default=64)
    ap.add_argument("--link-gbps", type=float, default=0.5)
    ap.add_argument("--remote-gbps", type=float, default=0.5)
    ap.add_argument(
        "--disk-gbps",
        type=float,
        default=None,
        help="load_then_serve: each node's disk read rate (default: --link-gbps / 10, the "
        "NIC-to-SSD ratio of λScale's testbed)",
    )
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(4, 12), metavar=("MIN", "MAX"))
    ap.add_argument(
        "--sources", default="1", help="hot instances at the start (K); a list runs each: 1,2,4"
    )
    ap.add_argument("--max-num-seqs", type=int, default=4, help="batch limit per instance")
    ap.add_argument("--bucket-s", type=float, default=0.25)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--no-cold-start", action="store_true", help="skip the ParaServe part")
    ap.add_argument(
        "--no-fuse-projections",
        action="store_true",
        help="agents' engines keep q/k/v and gate/up separate (EngineConfig.fuse_projections)",
    )
    ap.add_argument(
        "--separate-projections-store",
        action="store_true",
        help="import the model in the pre-version-3 layout (q/k/v, gate/up separate: engines "
        "that fuse copy them in their first steps)",
    )
    ap.add_argument(
        "--json", type=Path, default=Path("benchmarks/results/scaleout/scale_burst.json")
    )
    ap.add_argument("--png", type=Path, default=None)
    ap.add_argument(
        "--replot", type=Path, default=None, help="only redraw --png from this result JSON"
    )
    add_cluster_args(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.png or args.replot.with_suffix(".png"))
        return
    ks = [int(k) for k in str(args.sources).split(",")]
    report: dict = {
        "nodes": args.nodes,
        "blocks": args.blocks,
        "link_gbps": args.link_gbps,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "sources": ks[0] if len(ks) == 1 else ks,
        "prompt_len": list(args.prompt_len),
        "max_num_seqs": args.max_num_seqs,
        "fuse_projections": not args.no_fuse_projections,
        "store_projections": "separate" if args.separate_projections_store else "fused",
        "machine": machine(args),
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        create_tiny_model(tmp / "hf", model_config(args.model_mb, args.blocks))
        import_checkpoint(
            tmp / "hf",
            tmp / "reg" / MODEL,
            num_blocks=args.blocks,
            progress=False,
            fuse_projections=not args.separate_projections_store,
        )
        manifest = read_manifest(tmp / "reg" / MODEL)
        report["model_bytes"] = manifest.total_bytes
        runs = {k: run_modes(args, tmp, manifest, k) for k in ks}
        report["machine"] = runs[ks[0]].pop("machine")
        if len(ks) == 1:
            report.update(runs[ks[0]])
        else:
            report["by_sources"] = {str(k): r for k, r in runs.items()}
            report["p90_ttft_speedup"] = {
                str(k): r.get("p90_ttft_speedup") for k, r in runs.items()
            }
            report["p90_ttft_vs_load_then_serve"] = {
                str(k): r.get("p90_ttft_vs_load_then_serve") for k, r in runs.items()
            }
            report["modes"] = runs[ks[-1]]["modes"]  # the summary shows the largest K
        if not args.no_cold_start:
            report["paraserve_cold_start"] = cold_starts(args, tmp, manifest)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.png:
        plot(report, args.png)
    brief = {
        m: {k: v for k, v in r.items() if k != "tokens_per_s_timeline"}
        for m, r in report["modes"].items()
    }
    print(
        json.dumps(
            {k: v for k, v in report.items() if k not in ("modes", "by_sources")}
            | {"modes": brief},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
