"""Whether pipelines serving on the receiving nodes stretch the scale-out's multicast
(calibration fix 15: `TestbedHost.transfer_wakeups_queue`).

What flows: the burst's model on a `LocalCluster` of the burst's 8 agents at its link cap.
Every agent holds it (`m`) in its gpu tier (loaded from disk, as
`measure.measure_endpoint_open` does); the K=2 hot sources (agents 0, 1)
serve a burst through `LocalEndpoint`s and also hold copies (`c0`, `c1`, ...) in their host
tier, which the multicasts move (the K=2 scale-out's binomial plan and pipelines' block
order, into the others' gpu tier, nothing opened). The plan's execution pipelines are open
on the receivers over `m`. `PAIRS` pairs, alternating: a multicast while the hot sources
AND the pipelines serve ("served": the K=2 execute-while-load burst once its pipelines
opened) and a multicast while only the hot sources serve ("hot_only": stop-the-world).
Per run, over the multicast's window: its time, the tokens/s the hot sources and the
pipelines served (the controller's receipt times), the agents' CPU cores, the receivers'
event loops' (main threads') on-CPU and run-queue wait (`/proc/PID/task/PID/schedstat`:
their transfers' wake-ups waiting for a core) and the controller's cores.
Out: per pair and as medians, the multicast's time served / hot_only, the receivers' event
loops' share (on-CPU / (on-CPU + wait)), and fix 15's model of both from the busy serving
threads (K + the pipelines) and the transfer CPU measured in the hot_only run (the
receivers' event loops' cores): `compute_sharing.queued_flow_speed`; a check of fix 15,
not an input.
"""

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

PAIRS = 2
"""(served, hot_only) pairs per round."""
REQUESTS_FACTOR = 4
"""Each server's burst is this many times the benchmark's requests: serving outlasts the
multicast (two hot sources serve 2x the burst in ~1.3 s on a quiet host)."""
SOURCES = 2


def loop_schedstat(pid: int) -> tuple[float, float, int]:
    """(on-CPU s, run-queue wait s, time slices) of `pid`'s main thread (an agent's event
    loop, where its block transfers run) so far."""
    fields = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9, int(fields[2])


def model_of(hot_only: dict, busy_served: int, cores: float, transfer_cores: float) -> dict:
    """Fix 15's flow speeds and event-loop shares with the transfer CPU `hot_only` measured
    (its receivers' event loops' cores): served over hot_only (`module docstring`)."""
    from benchmarks.sim_calibrate.compute_sharing import queued_flow_speed

    demand = hot_only["receivers_loop_cores"]
    speed = {
        busy: queued_flow_speed(cores, busy, demand, transfer_cores)
        for busy in (SOURCES, busy_served)
    }
    share = {busy: min(1.0, cores / (busy + demand)) for busy in (SOURCES, busy_served)}
    return {
        "multicast_ratio": round(speed[SOURCES] / speed[busy_served], 4),
        "loop_share_served": round(share[busy_served], 4),
        "loop_share_hot_only": round(share[SOURCES], 4),
    }


def summarize(pairs: list[dict], busy_served: int, cores: float, transfer_cores: float) -> dict:
    """Per pair the measured ratios and shares beside the model's; their medians."""
    rows = []
    for p in pairs:
        served, hot = p["served"], p["hot_only"]
        model = model_of(hot, busy_served, cores, transfer_cores)
        rows.append(
            {
                "multicast_ratio": round(served["window_s"] / hot["window_s"], 4),
                "model_multicast_ratio": model["multicast_ratio"],
                "loop_share_served": served["receivers_loop_share"],
                "model_loop_share_served": model["loop_share_served"],
                "loop_share_hot_only": hot["receivers_loop_share"],
                "model_loop_share_hot_only": model["loop_share_hot_only"],
            }
        )
    return {
        "cores": cores,
        "transfer_cores": transfer_cores,
        "busy_served": busy_served,
        "pairs": pairs,
        "ratios": rows,
        "median": {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]},
    }


def measure_queue(
    model_mb: float,
    blocks: int,
    real: dict,
    cores: float,
    transfer_cores: float,
    pairs: int = PAIRS,
) -> dict:
    """`pairs` (served, hot_only) multicasts (module docstring)."""
    from benchmarks.common import burst_cluster_config, model_config, registry_model, seed_disk
    from benchmarks.sim_calibrate.measure import burst_prompts, processes_cpu_s
    from surge.config import EngineConfig
    from surge.engine.sampling import SamplingParams
    from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
    from surge.runtime.endpoints import LocalEndpoint
    from surge.runtime.launch.local import LocalCluster
    from surge.runtime.multicast import MulticastExecutor
    from surge.runtime.pipeline_endpoint import PipelineEndpoint
    from surge.runtime.protocol import LoadOp, RegisterOp
    from surge.runtime.scaleout.context import stage_layers
    from surge.runtime.server import Server

    nodes, batch = real["nodes"], real["max_num_seqs"]
    prompts = burst_prompts(real["requests"] * REQUESTS_FACTOR, tuple(real["prompt_len"]))
    params = SamplingParams(max_tokens=real["max_tokens"], ignore_eos=True)
    engine_cfg = EngineConfig(max_num_seqs=batch, max_kv_tokens=2048)
    copies = [f"c{i}" for i in range(2 * pairs)]
    out = plan_scale_out(MulticastRequest(num_nodes=nodes, num_blocks=blocks, num_sources=SOURCES))
    receivers = list(range(SOURCES, nodes))

    async def run(cluster: LocalCluster, manifest) -> list[dict]:
        client = cluster.client()
        await client.connect()
        await cluster.wire_peers(client)
        for name in ("m", *copies):
            await client.broadcast(RegisterOp(name, manifest))
        load = LoadOp("m", tuple(range(blocks)), tier="gpu", source="disk")
        await asyncio.gather(*(client.call(n, load) for n in range(nodes)))
        for name in copies:
            for n in range(SOURCES):
                await client.call(n, LoadOp(name, tuple(range(blocks)), "host", source="disk"))
        hot_server, pipe_server = Server(client, "m"), Server(client, "m")
        pids = {n: p.pid for n, p in cluster.procs.items()}

        async def multicast(copy: str, served: bool) -> dict:
            reqs = [(hot_server, hot_server.new_request(p, params)) for p in prompts]
            if served:
                reqs += [(pipe_server, pipe_server.new_request(p, params)) for p in prompts]
            cpu0 = {n: processes_cpu_s([pid]) for n, pid in pids.items()}
            loop0 = [loop_schedstat(pids[n]) for n in receivers]
            ctl0 = time.process_time()
            for server, r in reqs:
                await server.submit(r)
            start = time.monotonic()
            res = await MulticastExecutor(
                client, copy, out.plan, tier="gpu", pipelines=out.pipelines, timeout_s=120
            ).run()
            if res.complete_s is None:
                raise RuntimeError(f"the multicast of {copy} did not complete")
            window_s = time.monotonic() - start
            cpu = {n: processes_cpu_s([pid]) - cpu0[n] for n, pid in pids.items()}
            loop = [loop_schedstat(pids[n]) for n in receivers]
            on_cpu, waited, slices = (
                sum(a[i] - b[i] for a, b in zip(loop, loop0, strict=True)) for i in range(3)
            )
            controller = time.process_time() - ctl0
            unfinished = sum(1 for _, r in reqs if r.done_t is None)
            await hot_server.wait_all(600)
            await pipe_server.wait_all(600)
            end = start + window_s
            tokens = {
                server: sum(
                    start <= t <= end for x, r in reqs if x is server for t in r.token_times
                )
                for server in (hot_server, pipe_server)
            }
            return {
                "window_s": round(window_s, 3),
                # 0: the serving ended inside the multicast (then it did not serve throughout)
                "requests_left_at_end": unfinished,
                # the controller's receipt times: serving while the multicast ran
                "hot_tokens_per_s": round(tokens[hot_server] / window_s, 1),
                "pipelines_tokens_per_s": round(tokens[pipe_server] / window_s, 1),
                "receivers_loop_cores": round(on_cpu / window_s, 3),
                "receivers_loop_wait_cores": round(waited / window_s, 3),
                "receivers_loop_share": round(on_cpu / max(on_cpu + waited, 1e-9), 4),
                "receivers_loop_slices_per_s": round(slices / window_s, 1),
                "receivers_loop_wait_per_slice_ms": round(1e3 * waited / max(slices, 1), 3),
                "receivers_loop_cpu_per_slice_ms": round(1e3 * on_cpu / max(slices, 1), 3),
                "sources_cores": round(sum(cpu[n] for n in range(SOURCES)) / window_s, 3),
                "receivers_cores": round(sum(cpu[n] for n in receivers) / window_s, 3),
                "controller_cores": round(controller / window_s, 3),
                "load_average": round(__import__("os").getloadavg()[0], 2),
            }

        done = []
        try:
            for n in range(SOURCES):
                hot = LocalEndpoint(client, n, "m", f"hot{n}", capacity=batch)
                await hot.open()
                await hot_server.add_endpoint(hot)
            for i, pipe in enumerate(out.pipelines):
                stages = stage_layers(manifest, pipe)
                ep = PipelineEndpoint(client, manifest, "m", f"pipe{i}", stages, engine_cfg)
                await ep.open()
                await pipe_server.add_endpoint(ep)
            for server in (hot_server, pipe_server):  # the engines' first steps, discarded
                for p in prompts[:8]:
                    await server.submit(server.new_request(p, params))
                await server.wait_all(600)
            for i in range(pairs):
                served = await multicast(copies[2 * i], True)
                done.append(
                    {"served": served, "hot_only": await multicast(copies[2 * i + 1], False)}
                )
        finally:
            await hot_server.close()
            await pipe_server.close()
            await client.close()
        return done

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = registry_model(tmp, model_config(model_mb, blocks), blocks)
        ccfg = burst_cluster_config(nodes, real["link_gbps"], batch, tmp)
        with LocalCluster(ccfg) as cluster:
            for n in range(nodes):
                seed_disk(cluster, n, "m", tmp / "reg" / "m", manifest)
            for name in copies:
                for n in range(SOURCES):
                    seed_disk(cluster, n, name, tmp / "reg" / "m", manifest)
            got = asyncio.run(run(cluster, manifest))
    return summarize(got, SOURCES + len(out.pipelines), cores, transfer_cores)


def median_queue(rounds: list[dict]) -> dict | None:
    """The medians over every pair of every round holding a `queue` measurement (None if
    none does; each round's ratios derived again from its pairs)."""
    got = [r["queue"] for r in rounds if "pairs" in r.get("queue", {})]
    rows = [
        row
        for g in got
        for row in summarize(g["pairs"], g["busy_served"], g["cores"], g["transfer_cores"])[
            "ratios"
        ]
    ]
    if not rows:
        return None
    return {k: round(statistics.median(row[k] for row in rows), 4) for k in rows[0]}


if __name__ == "__main__":
    # python -m benchmarks.sim_calibrate.wakeup_queue --json J [--rounds 1] [--pairs 2]
    import argparse
    import json
    import logging

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=PAIRS)
    ap.add_argument("--cores", type=float, default=2)
    ap.add_argument(
        "--transfer-cores",
        type=float,
        default=None,
        help="cores per block transfer (default: --profile's transfer_cores_serving)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=Path(__file__).parent / "recorded" / "sim_calibration_repeats_fix12.json",
    )
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    results = Path(__file__).parents[1] / "results" / "scaleout"
    real = json.loads((results / "scale_burst.json").read_text())
    w = args.transfer_cores
    if w is None:
        calib = json.loads(args.profile.read_text())
        w = calib.get("transfer_cores_serving") or calib["transfer_cores"]
    rounds = []
    for i in range(args.rounds):
        got = measure_queue(64, real["blocks"], real, args.cores, w, args.pairs)
        rounds.append({"queue": got})
        logging.info("round %d: %s", i, got["median"])
    args.json.write_text(json.dumps({"profile_rounds": rounds}, indent=1) + "\n")
