"""Blocks into an agent that serves vs into one that does not: calibration fix 11.

What flows: the burst's model on a `LocalCluster` of 5 agents at the burst's link cap.
Agents 0 and 1 hold it (`m`) in their gpu tier and serve a burst through `LocalEndpoint`s
(the K=2 burst's hot instances, which saturate the 2 cores as the burst does); agents 2
and 3 hold copies registered under other names (`r0`, `r1`, ...) in their host tier; agent
4 holds nothing and serves nothing. Each pair moves one copy's blocks at once, one chain
per receiver: every block from one sender into agent 0 (serving, the receiving end of an
execution pipeline's stage: it builds runners as blocks land, into the gpu tier, as a
scale-out does) and from the other sender into agent 4 (idle), the senders swapped from
pair to pair (`MulticastExecutor`, its per-block arrival times). A control pair runs the
same before the burst, nothing serving (both receivers idle: the two chains' own
difference).
Out: per pair, each receiver's seconds from the first block's start to its last block
(`serving_s`, `idle_s`), their ratio, every agent's cores over the pair (`/proc`: was the
host saturated, the receiver busy serving?), and the medians: `serving_receive_slowdown` =
median(serving_s / idle_s) over the pairs during the burst, which
`TestbedHost.serving_receive_slowdown` takes (`sim_calibrate/predict.py` fix 11: a serving
node's ingress links at 1 / that, instead of fix 9's share formula). Nothing is fitted to
the bursts: the ratio is a transfer's own time in this runtime.
"""

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

PAIRS = 3
"""Pairs of chains during the burst (the median is taken)."""
REQUESTS_FACTOR = 5
"""The burst is this many times the benchmark's requests: serving outlasts the pairs."""
HOT = (0, 1)
SENDERS = (2, 3)
IDLE = 4


def chain_plan(blocks: int, serving_first: bool):
    """Plan nodes 0, 1 = the two senders, 2 = the serving receiver, 3 = the idle one: each
    step moves block t from one sender to each receiver (sender 0 feeds the serving
    receiver when `serving_first`, else sender 1)."""
    from surge.policy.multicast.plan import Transfer, make_plan

    a, b = (0, 1) if serving_first else (1, 0)
    steps = [[Transfer(a, 2, t), Transfer(b, 3, t)] for t in range(blocks)]
    return make_plan("two-chains", 4, blocks, 2, steps)


def receive_seconds(arrival_s: list[list[float | None]]) -> tuple[float, float]:
    """(serving, idle) receiver's seconds until its last block (plan nodes 2 and 3)."""
    return tuple(max(t for t in arrival_s[v] if t is not None) for v in (2, 3))  # type: ignore[return-value]


def median_receive(rounds: list[dict]) -> float | None:
    """The median slow-down over every pair of every round holding a `receive` measurement
    (None if none does)."""
    ratios = [p["ratio"] for r in rounds if "receive" in r for p in r["receive"]["pairs"]]
    return round(statistics.median(ratios), 4) if ratios else None


def measure_receive_while_serving(model_mb: float, blocks: int, real: dict) -> dict:
    """The control pair, then `PAIRS` pairs during a burst on the two hot instances."""
    from benchmarks.common import burst_cluster_config, model_config, registry_model, seed_disk
    from benchmarks.sim_calibrate.measure import burst_prompts, processes_cpu_s
    from surge.engine.sampling import SamplingParams
    from surge.runtime.endpoints import LocalEndpoint
    from surge.runtime.launch.local import LocalCluster
    from surge.runtime.multicast import MulticastExecutor
    from surge.runtime.protocol import LoadOp, RegisterOp
    from surge.runtime.server import Server

    prompts = burst_prompts(real["requests"] * REQUESTS_FACTOR, tuple(real["prompt_len"]))
    params = SamplingParams(max_tokens=real["max_tokens"], ignore_eos=True)
    copies = [f"r{i}" for i in range(PAIRS + 1)]

    async def pair(client, pids: dict[int, int], name: str, serving_first: bool) -> dict:
        agents = [*SENDERS, HOT[0], IDLE]
        plan = chain_plan(blocks, serving_first)
        cpu0, t0 = {n: processes_cpu_s([p]) for n, p in pids.items()}, time.monotonic()
        res = await MulticastExecutor(client, name, plan, agents, tier="gpu", timeout_s=120).run()
        wall = time.monotonic() - t0
        cores = {n: (processes_cpu_s([p]) - cpu0[n]) / wall for n, p in pids.items()}
        if res.complete_s is None:
            raise RuntimeError(f"{name}: the chains did not complete")
        serving, idle = receive_seconds(res.arrival_s)
        return {
            "serving_s": round(serving, 4),
            "idle_s": round(idle, 4),
            "ratio": round(serving / idle, 4),
            "serving_fed_by": SENDERS[0 if serving_first else 1],
            # each agent's cores over the pair (the host saturated? the receiver busy?)
            "agents_cores": {str(n): round(c, 3) for n, c in cores.items()},
        }

    async def run(cluster: LocalCluster, manifest) -> dict:
        client = cluster.client()
        await client.connect()
        await cluster.wire_peers(client)
        for name in ("m", *copies):
            await client.broadcast(RegisterOp(name, manifest))
        for n in HOT:
            await client.call(n, LoadOp("m", tuple(range(blocks)), tier="gpu", source="disk"))
        for name in copies:
            for n in SENDERS:
                await client.call(n, LoadOp(name, tuple(range(blocks)), "host", source="disk"))
        server = Server(client, "m")
        pids = {n: p.pid for n, p in cluster.procs.items()}
        try:
            control = await pair(client, pids, copies[0], True)
            for n in HOT:
                hot = LocalEndpoint(client, n, "m", f"hot{n}", capacity=real["max_num_seqs"])
                await hot.open()
                await server.add_endpoint(hot)
            reqs = [server.new_request(p, params) for p in prompts]
            for r in reqs:
                await server.submit(r)
            pairs = [await pair(client, pids, c, i % 2 == 0) for i, c in enumerate(copies[1:])]
            end = time.monotonic()
            await server.wait_all(600)
        finally:
            await server.close()
            await client.close()
        last = max(r.done_t for r in reqs)
        if last < end:
            raise RuntimeError(f"the burst ended {end - last:.2f} s before the pairs")
        return {"control": control, "pairs": pairs}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = registry_model(tmp, model_config(model_mb, blocks), blocks)
        ccfg = burst_cluster_config(5, real["link_gbps"], real["max_num_seqs"], tmp)
        with LocalCluster(ccfg) as cluster:
            for n in (*HOT, *SENDERS):
                for name in ("m", *copies) if n in SENDERS else ("m",):
                    seed_disk(cluster, n, name, tmp / "reg" / "m", manifest)
            out = asyncio.run(run(cluster, manifest))
    out["serving_receive_slowdown"] = median_receive([{"receive": out}])
    return out


if __name__ == "__main__":
    # python -m benchmarks.sim_calibrate.receive --json J [--rounds 2]; `--reuse OLD J`
    # adds these rounds to an older calibration's (as `sim_calibrate/contention`).
    import argparse
    import json
    import logging

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    real = json.loads(
        (Path(__file__).parents[1] / "results" / "scaleout" / "scale_burst.json").read_text()
    )
    rounds = []
    for i in range(args.rounds):
        t = time.monotonic()
        rounds.append({"receive": measure_receive_while_serving(64, real["blocks"], real)})
        got = rounds[-1]["receive"]
        logging.info(
            "round %d (%.0f s): control %.3f, serving/idle %s",
            i,
            time.monotonic() - t,
            got["control"]["ratio"],
            [p["ratio"] for p in got["pairs"]],
        )
    args.json.write_text(json.dumps({"profile_rounds": rounds}, indent=1) + "\n")
