"""The multicast while K hot instances serve: what a saturated host does to both.

What flows: the burst's model on a `LocalCluster` of the burst's 8 agents at its link cap;
agents 0..K-1 hold it in their gpu tier and serve through `LocalEndpoint`s (K = 1, 2, as
the burst's hot instances), the others hold nothing. Per K (a fresh cluster each):
1. a short warm-up burst (discarded: the hot engines' first steps), then `IDLE_S` seconds
   with nothing running: the idle agents' own CPU (`others_idle_cores`, subtracted below);
2. a burst of 3x the benchmark's requests is submitted and, at once, the scale-out's
   multicast (`plan_scale_out`: binomial, K sources, its pipelines' block order) runs into
   the others' gpu tier, as `runtime/scaleout/multicast.run_multicast` does, opening no
   endpoint (the burst's conditions up to its first opening; the hot instances serve all
   through it): its end (`multicast_s`, against the plan at the cap) and the CPU seconds
   every agent and the controller used over that window (`/proc`).
Out (per K): `transfer_cores_serving`, the cores one block transfer in flight takes while
K hot instances serve: the non-serving agents' CPU over the window (receiving, verifying,
building runners, relaying; less their idle CPU) plus the hot agents' sending
(`send_cpu_s_per_gb` of the send profile x the GB they sent), per transfer, over a
transfer's time at the cap -- the quantity `measure_transport` measures as
`transfer_cores` on a host where nothing serves, here in the burst's conditions.
`sim_calibrate/main.py` fix 10 uses the median over the rounds and both K (one profile for every
scenario; per K they differed by less than the rounds did). The hot instances' tokens/s
over the window are kept as a record only: token times are the controller's receipt
times, which bunched on a saturated host (one source "served" 380 tokens/s right after a
multicast, above its engine's decode rate).
"""

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

WARM_UP_REQUESTS = 8
"""Requests of the warm-up burst (the hot engines' first steps, discarded)."""
IDLE_S = 1.0
"""Seconds with nothing running, for the idle agents' own CPU."""
REQUESTS_FACTOR = 3
"""The round's burst is this many times the benchmark's: serving outlasts the multicast."""


@dataclass(frozen=True)
class TransferShare:
    """What one run's multicast moved: K hot agents (0..K-1), its block transfers, how
    many of them the hot agents sent, a block's bytes and its seconds at the cap."""

    hot: int
    transfers: int
    sent_by_hot: int
    block_bytes: float
    block_s: float

    def cpu_s_per_transfer(
        self,
        agents_cpu_s: dict[int, float],
        others_idle_cores: float,
        window_s: float,
        send_cpu_s_per_gb: float,
    ) -> float:
        """CPU seconds per block transfer: the non-serving agents' CPU over the window less
        their idle CPU, plus the hot agents' sending at the send profile's CPU per GB (their
        own CPU is mostly serving, which is not the transfers')."""
        others = sum(c for n, c in agents_cpu_s.items() if n >= self.hot)
        others -= others_idle_cores * window_s
        hot_send = send_cpu_s_per_gb * self.sent_by_hot * self.block_bytes / 1e9
        return max(others + hot_send, 0.0) / self.transfers


def _tokens_in(reqs, t0: float, t1: float) -> int:
    return sum(1 for r in reqs for t in r.token_times if t0 < t <= t1)


def measure_multicast_while_serving(
    model_mb: float, blocks: int, real: dict, send_cpu_s_per_gb: float, ks: tuple[int, ...] = (1, 2)
) -> dict:
    """One run per K in `ks`: the multicast during a burst on K hot instances (see the
    module docstring); `send_cpu_s_per_gb` from the send profile of the same round."""
    from benchmarks.common import burst_cluster_config, model_config, registry_model, seed_disk
    from benchmarks.sim_calibrate.measure import burst_prompts, processes_cpu_s
    from surge.engine.sampling import SamplingParams
    from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
    from surge.runtime.endpoints import LocalEndpoint
    from surge.runtime.launch.local import LocalCluster
    from surge.runtime.multicast import MulticastExecutor
    from surge.runtime.protocol import LoadOp, RegisterOp
    from surge.runtime.server import Server

    nodes, batch = real["nodes"], real["max_num_seqs"]
    prompts = burst_prompts(real["requests"] * REQUESTS_FACTOR, tuple(real["prompt_len"]))
    params = SamplingParams(max_tokens=real["max_tokens"], ignore_eos=True)

    async def one_run(cluster: LocalCluster, manifest, k: int) -> dict:
        client = cluster.client()
        await client.connect()
        await cluster.wire_peers(client)
        await client.broadcast(RegisterOp("m", manifest))
        for n in range(k):
            await client.call(n, LoadOp("m", tuple(range(blocks)), tier="gpu", source="disk"))
        out = plan_scale_out(MulticastRequest(num_nodes=nodes, num_blocks=blocks, num_sources=k))
        server = Server(client, "m")
        pids = {n: p.pid for n, p in cluster.procs.items()}
        try:
            for n in range(k):
                hot = LocalEndpoint(client, n, "m", f"hot{n}", capacity=batch)
                await hot.open()
                await server.add_endpoint(hot)
            warm = [server.new_request(p, params) for p in prompts[:WARM_UP_REQUESTS]]
            for r in warm:
                await server.submit(r)
            await server.wait_all(600)
            idle0 = sum(processes_cpu_s([pid]) for n, pid in pids.items() if n >= k)
            await asyncio.sleep(IDLE_S)
            idle = sum(processes_cpu_s([pid]) for n, pid in pids.items() if n >= k) - idle0
            reqs = [server.new_request(p, params) for p in prompts]
            cpu0 = {n: processes_cpu_s([pid]) for n, pid in pids.items()}
            ctl0, start = time.process_time(), time.monotonic()
            for r in reqs:
                await server.submit(r)
            executor = MulticastExecutor(
                client, "m", out.plan, tier="gpu", pipelines=out.pipelines, timeout_s=120
            )
            res = await executor.run()
            window = time.monotonic() - start
            cpu = {n: processes_cpu_s([pid]) - cpu0[n] for n, pid in pids.items()}
            controller = time.process_time() - ctl0
            await server.wait_all(600)
        finally:
            await server.close()
            await client.close()
        if res.complete_s is None:
            raise RuntimeError(f"K={k}: the multicast did not complete")
        end = start + window
        last = max(r.done_t for r in reqs)
        if last < end:
            raise RuntimeError(f"K={k}: the burst ended {end - last:.2f} s before the multicast")
        during = _tokens_in(reqs, start, end) / window
        transfers = [tr for step in out.plan.steps for tr in step]
        sent_by_hot = sum(1 for tr in transfers if tr.src < k)
        block_bytes = manifest.total_bytes / blocks
        block_s = block_bytes * 8 / (real["link_gbps"] * 1e9)
        share = TransferShare(k, len(transfers), sent_by_hot, block_bytes, block_s)
        per_transfer = share.cpu_s_per_transfer(cpu, idle / IDLE_S, window, send_cpu_s_per_gb)
        others = sum(c for n, c in cpu.items() if n >= k) - idle / IDLE_S * window
        return {
            "sources": k,
            "multicast_s": round(window, 3),
            "multicast_complete_s": round(res.complete_s, 3),
            "multicast_plan_s": round(len(out.plan.steps) * block_s, 3),
            "transfers": len(transfers),
            "transfers_sent_by_hot": sent_by_hot,
            "tokens_per_s_during": round(during, 1),
            "others_idle_cores": round(idle / IDLE_S, 3),
            "agents_cpu_s": {str(n): round(c, 3) for n, c in cpu.items()},
            "hot_cores": round(sum(c for n, c in cpu.items() if n < k) / window, 3),
            "others_cores": round(others / window, 3),
            "controller_cores": round(controller / window, 3),
            "cpu_s_per_transfer": round(per_transfer, 5),
            "transfer_cores_serving": round(per_transfer / block_s, 4),
        }

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = registry_model(tmp, model_config(model_mb, blocks), blocks)
        for k in ks:
            ccfg = burst_cluster_config(nodes, real["link_gbps"], batch, tmp)
            with LocalCluster(ccfg) as cluster:
                for n in range(k):
                    seed_disk(cluster, n, "m", tmp / "reg" / "m", manifest)
                runs.append(asyncio.run(one_run(cluster, manifest, k)))
    return {
        "transfer_cores_serving": {str(r["sources"]): r["transfer_cores_serving"] for r in runs},
        "multicast_s": {str(r["sources"]): r["multicast_s"] for r in runs},
        "runs": runs,
    }


def median_contention(rounds: list[dict]) -> dict:
    """Per K, the median over the rounds of each number, and `transfer_cores_all_k`: the
    median over every round and K (rounds without the measurement are skipped; {} if
    none has it)."""
    got = [r["contention"] for r in rounds if "contention" in r]
    if not got:
        return {}
    out: dict = {"rounds": len(got)}
    for key in ("transfer_cores_serving", "multicast_s"):
        ks = sorted({k for g in got for k in g[key]})
        out[key] = {k: statistics.median(g[key][k] for g in got if k in g[key]) for k in ks}
    every = [v for g in got for v in g["transfer_cores_serving"].values()]
    out["transfer_cores_all_k"] = round(statistics.median(every), 4)
    return out


if __name__ == "__main__":
    # A same-session look: python -m benchmarks.sim_calibrate.contention --json J [--rounds 3];
    # each round also measures the standalone transport (`measure_transport`), order
    # alternating, so the two `transfer_cores` compare within one session.
    import argparse
    import json
    import logging

    from benchmarks.sim_calibrate.measure import measure_transport

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--send-cpu-s-per-gb", type=float, default=0.625, help="send profile's")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    real = json.loads(
        (Path(__file__).parents[1] / "results" / "scaleout" / "scale_burst.json").read_text()
    )
    rounds = []
    for i in range(args.rounds):
        t = time.monotonic()
        steps = {
            "contention": lambda: measure_multicast_while_serving(
                64, real["blocks"], real, args.send_cpu_s_per_gb
            ),
            "transport": lambda: measure_transport(64, real["blocks"], real, 1),
        }
        order = list(steps) if i % 2 == 0 else list(reversed(steps))
        rounds.append({name: steps[name]() for name in order})
        logging.info(
            "round %d (%.0f s): serving %s standalone %s",
            i,
            time.monotonic() - t,
            rounds[-1]["contention"]["transfer_cores_serving"],
            rounds[-1]["transport"]["transfer_cores"],
        )
    args.json.write_text(json.dumps({"profile_rounds": rounds}, indent=1) + "\n")
