"""Cold first-token time of one worker, with and without start-up overlap (ParaServe §5).

A node is chosen for a model that lives only in the remote registry (read through a slow
cap). Without overlap the worker first initialises its engine (imports torch, ~1.5 s here)
and only then fetches the model; with overlap the fetch starts as soon as the process runs
and the engine takes blocks as they stream in. Measured from the moment the node is chosen
(the agent process is launched) to the first token of one request; both modes alternate
over several rounds in the same run; the ratio is the result.

With `--cluster netns` the worker runs in its own network namespace with its CPU quota
(docs/testbed.md), so it does not share the machine's cores with the benchmark's client.

Usage: python -m benchmarks.scaleout.cold_start [--model-mb 32] [--blocks 8] [--remote-gbps 0.2]
       [--cluster loopback|netns]
"""

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import add_cluster_args, machine, make_cluster, model_config
from surge.engine.sampling import SamplingParams
from surge.model.importer import import_checkpoint
from surge.model.manifest import Manifest, read_manifest
from surge.model.tiny import create_tiny_model
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.launch.local import LocalCluster
from surge.runtime.protocol import LoadOp, RegisterOp
from surge.runtime.server import Server

log = logging.getLogger("cold_start")
MODEL = "cold"
MODES = ("no_overlap", "overlap")


async def first_token(cluster: LocalCluster, manifest: Manifest, t0: float) -> dict:
    client = cluster.client()
    await client.connect()
    await client.call(0, RegisterOp(MODEL, manifest))
    server = Server(client, MODEL)
    try:
        req = server.new_request([5, 6, 7, 8], SamplingParams(max_tokens=2, ignore_eos=True))
        await server.submit(req)  # queued until the worker serves
        blocks = tuple(range(manifest.num_blocks))
        reply = await client.call(0, LoadOp(MODEL, blocks, tier="gpu", source="remote"))
        ep = LocalEndpoint(client, 0, MODEL, "worker")
        await ep.open()
        await server.add_endpoint(ep)
        await asyncio.wait_for(req.done.wait(), 300)
        return {"first_token_s": req.first_token_t - t0, "fetch_s": reply.fetch_seconds}
    finally:
        await server.close()
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-mb", type=float, default=32)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--remote-gbps", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--json", type=Path, default=None, help="default: results/scaleout/cold_start.json"
    )
    add_cluster_args(ap)
    args = ap.parse_args()
    if args.json is None:
        suffix = "" if args.cluster == "loopback" else f"_{args.cluster}"
        args.json = Path(f"benchmarks/results/scaleout/cold_start{suffix}.json")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    where: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        create_tiny_model(tmp / "hf", model_config(args.model_mb, args.blocks))
        import_checkpoint(tmp / "hf", tmp / "reg" / MODEL, num_blocks=args.blocks, progress=False)
        manifest = read_manifest(tmp / "reg" / MODEL)
        for r in range(args.rounds):
            for mode in MODES:
                cluster = make_cluster(
                    args,
                    num_nodes=1,
                    remote_dir=tmp / "reg",
                    remote_gbps=args.remote_gbps,
                    preload_engine=mode == "no_overlap",
                )
                t0 = time.monotonic()  # the node is chosen: its worker process starts now
                with cluster:
                    where = machine(args, cluster)
                    ready_s = time.monotonic() - t0
                    res = asyncio.run(first_token(cluster, manifest, t0))
                res["ready_s"] = ready_s
                runs[mode].append(res)
                log.info("round %d %s: %s", r, mode, {k: round(v, 3) for k, v in res.items()})
    med = {m: statistics.median(x["first_token_s"] for x in runs[m]) for m in MODES}
    report = {
        "model_bytes": manifest.total_bytes,
        "blocks": manifest.num_blocks,
        "remote_gbps": args.remote_gbps,
        "rounds": args.rounds,
        "machine": where,
        "first_token_s": {m: round(v, 4) for m, v in med.items()},
        "speedup_overlap": round(med["no_overlap"] / med["overlap"], 3),
        "runs": {m: [{k: round(v, 4) for k, v in x.items()} for x in runs[m]] for m in MODES},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(
        json.dumps(
            {
                k: report[k]
                for k in ("first_token_s", "speedup_overlap", "model_bytes", "remote_gbps")
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
