"""Where a hot source's serving time goes while the scale-out's multicast runs
(calibration fix 12: `TestbedHost.transfer_wakeups`).

What flows: the burst's model on a `LocalCluster` of the burst's 8 agents at its link cap;
agent 0 holds it (`m`) in its gpu tier and serves through a `LocalEndpoint`, as the K=1
burst's hot instance; it also holds copies (`c0`, `c1`, ...) in its host tier, which the
multicasts move (the scale-out's binomial plan and pipelines' block order, into the
others' gpu tier, no endpoint opened: the burst's conditions up to its first opening).
`PAIRS` pairs: the burst served while a multicast runs ("multicast"), then the same burst
with nothing else running ("alone"), each over the multicast's window from its start.
Per run, from the agents' own token events (`TokenGenerated.t`: emission, not the
controller's receipt, which bunches on a saturated host) and `/proc`: the hot agent's
tokens/s, engine steps (events grouped by step), CPU cores and run-queue wait
(`/proc/PID/task/*/schedstat`: ready to run, not running); the other agents' and the
controller's cores.
Out: per pair and as medians, the hot agent's serving rate and cores during the multicast
over alone, and what fix 12's model says of its cores from the CPU the others used
(`wakeup_share` of one busy endpoint on the host's cores under that demand, times its
cores alone). The quiet N=3 (Nov 24 11:35-11:43 UTC, 6 pairs,
`sim_calibration_repeats_fix12.json`): with a multicast the hot agent ran on 0.62-0.84
cores (alone 0.99-1.00) while the other agents used 0.54-1.08 and the controller 0.04-0.05
(each round's first pair: 0.80-0.84 + 0.54-0.60 + 0.05 of the 2 cores, room left); its
threads waited runnable 0.38-0.74 cores' worth (alone 0.04-0.23): it loses its core to the
transfers' wake-ups. Fix 12's model from the others' CPU: 0.62-0.88
cores, each pair within -10% to +6% of the measured. Tokens per engine CPU-second 0.96-0.98 of
alone (fix 14), tokens per step 3.47-3.56 vs 3.53-3.61 (the runtime's batches refill one
request at a time in both).
"""

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

STEP_GAP_S = 0.0005
"""Token events of one engine step are emitted back to back; a larger gap starts a step."""
PAIRS = 2
"""(multicast, alone) pairs per round."""
REQUESTS_FACTOR = 2
"""Each burst is this many times the benchmark's requests: serving outlasts the window."""
HOT = 0
WARM_UP_REQUESTS = 8


def schedstat_s(pid: int, main_only: bool = False) -> tuple[float, float]:
    """(on-CPU, run-queue wait) seconds of every thread of `pid` so far (threads that end
    in between are lost; the agents' are long-lived); `main_only`: its main thread's (an
    agent's event loop: its I/O, not its engine steps)."""
    cpu = wait = 0
    tasks = [Path(f"/proc/{pid}/task/{pid}")] if main_only else Path(f"/proc/{pid}/task").iterdir()
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue
        cpu += int(fields[0])
        wait += int(fields[1])
    return cpu / 1e9, wait / 1e9


def steps_of(times: list[float], gap_s: float = STEP_GAP_S) -> list[list[float]]:
    """Token emission times grouped into engine steps (a gap over `gap_s` starts one)."""
    steps: list[list[float]] = []
    for t in sorted(times):
        if steps and t - steps[-1][-1] <= gap_s:
            steps[-1].append(t)
        else:
            steps.append([t])
    return steps


def model_cores(alone_cores: float, others_cores: float, cores: float) -> float:
    """The hot agent's cores during the multicast by fix 12's model: its cores alone times
    `wakeup_share` of one busy endpoint while the others' measured CPU runs first."""
    from benchmarks.sim_calibrate.compute_sharing import wakeup_share

    return alone_cores * wakeup_share(cores, 1, others_cores)


def per_engine_core(run: dict) -> float:
    """Tokens per second of the engine threads' CPU (the agent's CPU less its event loop's,
    where the sending is: fix 7's)."""
    return run["tokens_per_s"] / (run["cores"] - run.get("event_loop_cores", 0.0))


def summarize(pairs: list[dict], cores: float) -> dict:
    """Per pair the ratios (multicast / alone) and the model's cores; their medians."""
    rows = []
    for p in pairs:
        mc, alone = p["multicast"], p["alone"]
        rows.append(
            {
                "step_efficiency": round(per_engine_core(mc) / per_engine_core(alone), 4),
                "tokens_per_s_ratio": round(mc["tokens_per_s"] / alone["tokens_per_s"], 4),
                "cores_ratio": round(mc["cores"] / alone["cores"], 4),
                "hot_cores": mc["cores"],
                "model_hot_cores": round(model_cores(alone["cores"], mc["others_cores"], cores), 4),
                "model_hot_cores_with_controller": round(
                    model_cores(alone["cores"], mc["others_cores"] + mc["controller_cores"], cores),
                    4,
                ),
            }
        )
    return {
        "cores": cores,
        "pairs": pairs,
        "ratios": rows,
        "median": {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]},
    }


def measure_serving_during_multicast(
    model_mb: float, blocks: int, real: dict, cores: float, pairs: int = PAIRS
) -> dict:
    """`pairs` (multicast, alone) bursts on the K=1 hot agent (module docstring)."""
    from benchmarks.common import burst_cluster_config, model_config, registry_model, seed_disk
    from benchmarks.sim_calibrate.measure import burst_prompts, processes_cpu_s
    from surge.engine.sampling import SamplingParams
    from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
    from surge.runtime.endpoints import LocalEndpoint
    from surge.runtime.launch.local import LocalCluster
    from surge.runtime.multicast import MulticastExecutor
    from surge.runtime.protocol import LoadOp, RegisterOp, TokenGenerated
    from surge.runtime.server import Server

    nodes, batch = real["nodes"], real["max_num_seqs"]
    prompts = burst_prompts(real["requests"] * REQUESTS_FACTOR, tuple(real["prompt_len"]))
    params = SamplingParams(max_tokens=real["max_tokens"], ignore_eos=True)
    copies = [f"c{i}" for i in range(pairs)]
    out = plan_scale_out(MulticastRequest(num_nodes=nodes, num_blocks=blocks, num_sources=1))

    async def run(cluster: LocalCluster, manifest) -> list[dict]:
        client = cluster.client()
        await client.connect()
        await cluster.wire_peers(client)
        for name in ("m", *copies):
            await client.broadcast(RegisterOp(name, manifest))
        await client.call(HOT, LoadOp("m", tuple(range(blocks)), tier="gpu", source="disk"))
        for name in copies:
            await client.call(HOT, LoadOp(name, tuple(range(blocks)), "host", source="disk"))
        server = Server(client, "m")
        pids = {n: p.pid for n, p in cluster.procs.items()}
        events = client.subscribe((TokenGenerated,), model="m")
        offset = time.time() - time.monotonic()

        async def burst(copy: str | None, window_s: float) -> dict:
            while not events.empty():
                events.get_nowait()
            reqs = [server.new_request(p, params) for p in prompts]
            cpu0 = {n: processes_cpu_s([pid]) for n, pid in pids.items()}
            sched0 = schedstat_s(pids[HOT])
            loop0 = schedstat_s(pids[HOT], main_only=True)[0]
            ctl0, start = time.process_time(), time.monotonic()
            for r in reqs:
                await server.submit(r)
            if copy is not None:
                res = await MulticastExecutor(
                    client, copy, out.plan, tier="gpu", pipelines=out.pipelines, timeout_s=120
                ).run()
                if res.complete_s is None:
                    raise RuntimeError(f"the multicast of {copy} did not complete")
                window_s = time.monotonic() - start
            else:
                await asyncio.sleep(max(start + window_s - time.monotonic(), 0.0))
            cpu = {n: processes_cpu_s([pid]) - cpu0[n] for n, pid in pids.items()}
            on_cpu, waited = (a - b for a, b in zip(schedstat_s(pids[HOT]), sched0, strict=True))
            loop = schedstat_s(pids[HOT], main_only=True)[0] - loop0
            controller = time.process_time() - ctl0
            end = start + window_s
            await server.wait_all(600)
            if max(r.done_t for r in reqs) < end:
                raise RuntimeError("the burst ended inside the window: serve more requests")
            times = []
            while not events.empty():
                ev = events.get_nowait()
                if ev.node == HOT and start <= ev.t - offset <= end:
                    times.append(ev.t - offset)
            steps = len(steps_of(times))
            return {
                "window_s": round(window_s, 3),
                "tokens_per_s": round(len(times) / window_s, 1),
                "steps_per_s": round(steps / window_s, 1),
                "tokens_per_step": round(len(times) / max(steps, 1), 3),
                "cores": round(cpu[HOT] / window_s, 3),
                "on_cpu_cores": round(on_cpu / window_s, 3),
                "runqueue_wait_cores": round(waited / window_s, 3),
                "event_loop_cores": round(loop / window_s, 3),
                "others_cores": round(sum(c for n, c in cpu.items() if n != HOT) / window_s, 3),
                "controller_cores": round(controller / window_s, 3),
                "load_average": round(os.getloadavg()[0], 2),
            }

        done = []
        try:
            hot = LocalEndpoint(client, HOT, "m", "hot", capacity=batch)
            await hot.open()
            await server.add_endpoint(hot)
            warm = [server.new_request(p, params) for p in prompts[:WARM_UP_REQUESTS]]
            for r in warm:  # the engine's first steps, discarded
                await server.submit(r)
            await server.wait_all(600)
            for copy in copies:
                with_mc = await burst(copy, 0.0)
                done.append({"multicast": with_mc, "alone": await burst(None, with_mc["window_s"])})
        finally:
            client.unsubscribe(events)
            await server.close()
            await client.close()
        return done

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = registry_model(tmp, model_config(model_mb, blocks), blocks)
        ccfg = burst_cluster_config(nodes, real["link_gbps"], batch, tmp)
        with LocalCluster(ccfg) as cluster:
            for name in ("m", *copies):
                seed_disk(cluster, HOT, name, tmp / "reg" / "m", manifest)
            got = asyncio.run(run(cluster, manifest))
    return summarize(got, cores)


def median_serving(rounds: list[dict]) -> dict | None:
    """The medians over every pair of every round holding a `serving` measurement (None if
    none does; each round's ratios derived again from its pairs)."""
    got = [r["serving"] for r in rounds if "serving" in r]
    rows = [row for g in got for row in summarize(g["pairs"], g.get("cores", 2.0))["ratios"]]
    if not rows:
        return None
    return {k: round(statistics.median(row[k] for row in rows), 4) for k in rows[0]}


if __name__ == "__main__":
    # python -m benchmarks.sim_calibrate.serving --json J [--rounds 2]: rounds holding only
    # this measurement; `--reuse OLD J` adds them to an older calibration's.
    import argparse
    import json
    import logging

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cores", type=float, default=2)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    real = json.loads(
        (Path(__file__).parents[1] / "results" / "scaleout" / "scale_burst.json").read_text()
    )
    rounds = []
    for i in range(args.rounds):
        got = measure_serving_during_multicast(64, real["blocks"], real, args.cores)
        rounds.append({"serving": got})
        logging.info("round %d: %s", i, got["median"])
    args.json.write_text(json.dumps({"profile_rounds": rounds}, indent=1) + "\n")
