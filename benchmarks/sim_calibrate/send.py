"""What sending multicast blocks costs the agent that serves, in the runtime.

What flows: the burst's model (64 MB, 16 blocks) on a `LocalCluster` of 1 + 3 agents at
the burst's link cap; agent 0 holds it in its gpu tier and serves through a
`LocalEndpoint`, the others only receive. Per round (a fresh cluster each):
1. a warm-up burst (discarded), then the burst served with agent 0 not sending ("idle");
2. right after, the burst served while agent 0 sends the model to agents 2 and 3, one after
   the other, as a multicast source does ("serve + send"): tokens per second over the
   sending window, against the idle burst's over the same window from its start;
3. agent 0 sends the whole model to agent 1 and serves nothing ("send only"): agent 0's CPU
   seconds (/proc) per GB sent.
Out: `send_cpu_s_per_gb` (step 3) and `send_cost_s_per_gb` = the serving rate lost while
sending (1 - serve+send / idle) per GB/s sent (step 2): what `TestbedHost.send_cost_s_per_gb`
applies (a node sending at B GB/s serves at 1 - cost * B). Nov 23: 0.86 s/GB at 21:10,
about the sending CPU (0.94-1.25 CPU-s/GB); before the issue-15 engine changes (~20:30)
6.6-17 s/GB, the agent then serving at ~half its rate on < 0.7 cores. The machine's other
load (other sessions) is in both bursts alike; the rounds are medians.
"""

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

RECEIVERS = 3
"""Agents 2 and 3 for the serve + send window, agent 1 for the send-only copy."""
BURST_FACTOR = 3
"""The bursts here are this many times the benchmark's, so the idle one outlasts the
sending window (two copies at the cap): on the Nov 24 host (reads ~2x faster than Nov 23's)
the benchmark's 64 requests ended inside it ("send less")."""


def measure_send_cost(model_mb: float, blocks: int, real: dict, reps: int) -> dict:
    """Agent 0's CPU per GB sent and its serving rate lost per GB/s sent (medians of
    `reps` rounds)."""
    from benchmarks.common import burst_cluster_config, model_config, registry_model, seed_disk
    from benchmarks.sim_calibrate.measure import burst_prompts, processes_cpu_s
    from surge.engine.sampling import SamplingParams
    from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
    from surge.runtime.endpoints import LocalEndpoint
    from surge.runtime.launch.local import LocalCluster
    from surge.runtime.multicast import MulticastExecutor
    from surge.runtime.protocol import LoadOp, RegisterOp
    from surge.runtime.server import Server

    batch = real["max_num_seqs"]
    prompts = burst_prompts(real["requests"] * BURST_FACTOR, tuple(real["prompt_len"]))
    params = SamplingParams(max_tokens=real["max_tokens"], ignore_eos=True)
    plan = plan_scale_out(MulticastRequest(num_nodes=2, num_blocks=blocks, num_sources=1)).plan

    def tokens_by(reqs, start: float, window_s: float) -> int:
        return sum(1 for r in reqs for t in r.token_times if t - start <= window_s)

    async def one_round(cluster: LocalCluster, manifest) -> dict:
        client = cluster.client()
        await client.connect()
        await cluster.wire_peers(client)
        await client.broadcast(RegisterOp("m", manifest))
        await client.call(0, LoadOp("m", tuple(range(blocks)), tier="gpu", source="disk"))
        server = Server(client, "m")
        pid = [cluster.procs[0].pid]

        async def send(to: int) -> float:
            res = await MulticastExecutor(client, "m", plan, agents=[0, to], timeout_s=120).run()
            if res.complete_s is None:
                raise RuntimeError(f"the copy to agent {to} did not complete")
            return res.complete_s

        async def serve(sending_to: tuple[int, ...]) -> tuple[list, float, float, float]:
            reqs = [server.new_request(p, params) for p in prompts]
            c0, start = processes_cpu_s(pid), time.monotonic()
            for r in reqs:
                await server.submit(r)
            for to in sending_to:
                await send(to)
            window = time.monotonic() - start
            cpu = processes_cpu_s(pid) - c0
            await server.wait_all(600)
            return reqs, start, window, cpu

        try:
            ep = LocalEndpoint(client, 0, "m", "hot", capacity=batch)
            await ep.open()
            await server.add_endpoint(ep)
            await serve(())  # warm-up
            idle, idle_start, _, _ = await serve(())
            idle_done_s = max(r.done_t for r in idle) - idle_start
            busy, start, window, busy_cpu = await serve(tuple(range(2, 2 + RECEIVERS - 1)))
            c0 = processes_cpu_s(pid)
            send_only_s = await send(1)
            send_only_cpu = processes_cpu_s(pid) - c0
        finally:
            await server.close()
            await client.close()
        if window >= idle_done_s:
            raise RuntimeError("the idle burst ended inside the sending window: send less")
        gb = manifest.total_bytes / 1e9
        idle_rate = tokens_by(idle, idle_start, window) / window
        busy_rate = tokens_by(busy, start, window) / window
        sent_gb_per_s = (RECEIVERS - 1) * gb / window
        return {
            "idle_tokens_per_s": round(idle_rate, 1),
            "serve_send_tokens_per_s": round(busy_rate, 1),
            "window_s": round(window, 3),
            "sent_gb_per_s": round(sent_gb_per_s, 4),
            "serve_send_cores": round(busy_cpu / window, 3),
            "send_only_s": round(send_only_s, 3),
            "send_only_cores": round(send_only_cpu / send_only_s, 3),
            "send_cpu_s_per_gb": round(send_only_cpu / gb, 4),
            "send_cost_s_per_gb": round((1 - busy_rate / idle_rate) / sent_gb_per_s, 4),
        }

    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = registry_model(tmp, model_config(model_mb, blocks), blocks)
        for _ in range(reps):
            ccfg = burst_cluster_config(1 + RECEIVERS, real["link_gbps"], batch, tmp)
            with LocalCluster(ccfg) as cluster:
                seed_disk(cluster, 0, "m", tmp / "reg" / "m", manifest)
                rounds.append(asyncio.run(one_round(cluster, manifest)))
    out = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    return out | {"rounds": rounds}


if __name__ == "__main__":  # a quick look: python -m benchmarks.sim_calibrate.send
    import json

    real = json.loads(
        (Path(__file__).parents[1] / "results" / "scaleout" / "scale_burst.json").read_text()
    )
    print(json.dumps(measure_send_cost(64, real["blocks"], real, 1), indent=1))
