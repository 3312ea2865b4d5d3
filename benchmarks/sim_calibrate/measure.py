"""What `benchmarks/sim_calibrate/main.py` measures on this machine (the runtime's costs).

- `measure_engine`: the serving step as an agent runs it (`LLMEngine.step()`, CPU, one
  thread) at the burst's batch shapes, fitted per layer, plus the agent round trip per step.
- `measure_transport`: one block between two capped agents and the whole multicast to the
  burst's nodes (K=1, K=2): effective link rate and the agents' CPU per block transfer.
- `measure_endpoint_open`: what opening one endpoint costs the runtime's controller while
  the burst is being served (`LocalEndpoint.open` + `Server.add_endpoint`, as
  `runtime/scaleout/local.open_local` does; `PipelineEndpoint.open` + `add_endpoint` for
  the planned execution pipelines, as `runtime/scaleout/multicast.LoadingCarrier` does).
Each returns a dict of numbers that `sim_calibrate/main` turns into a simulator profile.
"""

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def processes_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds the processes `pids` have used so far (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(intercept), float(slope)


def burst_prompts(requests: int, prompt_len: tuple[int, int]) -> list[list[int]]:
    """The prompts of scale_burst (same RNG draws)."""
    import random

    rng = random.Random(0)
    lo, hi = prompt_len
    return [[rng.randrange(2, 500) for _ in range(rng.randint(lo, hi))] for _ in range(requests)]


def measure_engine(model_mb: float, blocks: int, reps: int, real: dict) -> dict:
    """Per-layer prefill/decode linear costs of the serving step as an agent runs it:
    `LLMEngine.step()` (scheduler + `ModelRunner` + sampler) on CPU with one thread, plus
    the agent round trip per step (token events to the controller's `Server`), measured
    as (burst through a 1-node `LocalCluster` - same burst in process) / steps."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import asyncio

    import torch

    from benchmarks.common import model_config, registry_model, seed_disk
    from surge.config import EngineConfig
    from surge.engine.llm_engine import LLMEngine, LocalExecutor
    from surge.engine.runner import ModelRunner
    from surge.engine.sampling import SamplingParams
    from surge.runtime.endpoints import LocalEndpoint
    from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
    from surge.runtime.protocol import LoadOp, RegisterOp
    from surge.runtime.server import Server

    torch.set_num_threads(1)
    cfg = model_config(model_mb, blocks)
    batch_limit = real["max_num_seqs"]
    prompts = burst_prompts(real["requests"], tuple(real["prompt_len"]))
    burst_params = SamplingParams(max_tokens=real["max_tokens"], ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = registry_model(tmp, cfg, blocks)
        runner = ModelRunner(manifest, EngineConfig(max_num_seqs=8, max_kv_tokens=2048))
        runner.load_blocks()
        engine = LLMEngine(
            manifest, EngineConfig(max_num_seqs=8, max_kv_tokens=2048), LocalExecutor(runner)
        )
        gen = torch.Generator().manual_seed(0)

        def run(batch: int, q: int, out: int) -> tuple[float, list[float]]:
            """One batch of `batch` prompts of `q` tokens: prefill step s, decode steps s."""
            params = SamplingParams(max_tokens=out, ignore_eos=True)
            for _ in range(batch):
                engine.add_request(
                    torch.randint(2, cfg.vocab_size, (q,), generator=gen).tolist(), params
                )
            times = []
            while engine.has_unfinished:
                t = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - t)
            return times[0], times[1:]

        for _ in range(5):
            run(4, 8, 4)
        layers = cfg.num_layers
        prefill, decode = [], []  # (tokens, s), (batch, s): the burst's shapes (1-4 x 4..12)
        for batch, q in ((1, 4), (1, 8), (1, 12), (2, 8), (3, 8), (4, 4), (4, 8), (4, 12), (8, 8)):
            pre, dec = [], []
            for _ in range(reps):
                p, d = run(batch, q, real["max_tokens"])
                pre.append(p)
                dec.append(statistics.median(d))
            prefill.append((batch * q, statistics.median(pre)))
            if q == 8:
                decode.append((batch, statistics.median(dec)))

        def in_process() -> tuple[float, int]:
            steps, t = 0, time.perf_counter()
            for prompt in prompts:
                engine.add_request(prompt, burst_params)
            while engine.has_unfinished:
                engine.step()
                steps += 1
            return time.perf_counter() - t, steps

        async def via_agent(cluster: LocalCluster) -> list[float]:
            client = cluster.client()
            await client.connect()
            await client.broadcast(RegisterOp("m", manifest))
            await client.call(0, LoadOp("m", tuple(range(blocks)), tier="gpu", source="disk"))
            server = Server(client, "m")
            ep = LocalEndpoint(client, 0, "m", "m-node0", capacity=batch_limit)
            await ep.open()
            await server.add_endpoint(ep)
            out = []
            try:
                for _ in range(reps // 2 + 2):
                    reqs = [server.new_request(p, burst_params) for p in prompts]
                    t = time.monotonic()
                    for r in reqs:
                        await server.submit(r)
                    await server.wait_all(600)
                    out.append(max(r.done_t for r in reqs) - t)
            finally:
                await server.close()
                await client.close()
            return out[1:]  # the first run warms the agent's engine up

        engine = LLMEngine(
            manifest,
            EngineConfig(max_num_seqs=batch_limit, max_kv_tokens=2048),
            LocalExecutor(runner),
        )
        in_process()
        local = [in_process() for _ in range(reps // 2 + 1)]
        steps = local[0][1]
        local_s = statistics.median(t for t, _ in local)
        ccfg = LocalClusterConfig(
            num_nodes=1,
            max_num_seqs=batch_limit,
            max_kv_tokens=2048,
            remote_dir=tmp / "reg",
            threads_per_agent=1,
        )
        with LocalCluster(ccfg) as cluster:
            seed_disk(cluster, 0, "m", tmp / "reg" / "m", manifest)
            agent_s = statistics.median(asyncio.run(via_agent(cluster)))
    round_trip = max(agent_s - local_s, 0.0) / steps
    a_p, b_p = fit([t for t, _ in prefill], [s / layers for _, s in prefill])
    a_d, b_d = fit([b for b, _ in decode], [s / layers for _, s in decode])
    tokens = real["requests"] * real["max_tokens"]
    return {
        "num_layers": layers,
        "model_bytes": manifest.total_bytes,
        "arch": {
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_heads": cfg.num_heads,
            "num_kv_heads": cfg.num_kv_heads,
            "vocab_size": cfg.vocab_size,
        },
        "prefill_points_s": [[t, round(s, 6)] for t, s in prefill],
        "decode_points_s": [[b, round(s, 6)] for b, s in decode],
        "burst_steps": steps,
        "burst_tokens_per_s_in_process": round(tokens / local_s, 1),
        "burst_tokens_per_s_via_agent": round(tokens / agent_s, 1),
        "agent_round_trip_per_step_s": round(round_trip, 6),
        # The round trip is a per-step cost: spread over the layers of a whole-model step.
        "per_layer_s": {
            "prefill_fixed": a_p + round_trip / layers,
            "prefill_per_token": b_p,
            "decode_fixed": a_d + round_trip / layers,
            "decode_per_seq": b_d,
        },
    }


def measure_transport(model_mb: float, blocks: int, real: dict, reps: int) -> dict:
    """One block transfer between two agents at the benchmark's cap, and the multicast of
    the whole model to the benchmark's nodes (K=1 and K=2, no serving): effective link
    rate, and the agents' CPU per block transfer (framing, receive, crc32 verify)."""
    import asyncio

    from benchmarks.common import model_config, registry_model
    from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
    from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
    from surge.runtime.multicast import MulticastExecutor
    from surge.runtime.protocol import LoadOp, RegisterOp

    cpu_s = processes_cpu_s

    async def multicast(cluster: LocalCluster, manifest, nodes: int, sources: int) -> dict:
        client = cluster.client()
        await client.connect()
        await cluster.wire_peers(client)
        await client.broadcast(RegisterOp("m", manifest))
        load = LoadOp("m", tuple(range(blocks)), tier="host", source="remote")
        await asyncio.gather(*(client.call(s, load) for s in range(sources)))
        out = plan_scale_out(
            MulticastRequest(num_nodes=nodes, num_blocks=blocks, num_sources=sources)
        )
        pids = [p.pid for p in cluster.procs.values()]
        c0 = cpu_s(pids)
        # Into the gpu tier, as a scale-out lands them (`runtime/scaleout/multicast.py`): the
        # receivers build their runners block by block (+26% CPU per transfer vs the host tier).
        res = await MulticastExecutor(client, "m", out.plan, tier="gpu", timeout_s=60).run()
        used = cpu_s(pids) - c0
        await client.close()
        transfers = sum(len(s) for s in out.plan.steps)
        return {
            "complete_s": res.complete_s,
            "plan_steps": len(out.plan.steps),
            "transfers": transfers,
            "cpu_s_per_transfer": used / transfers,
            "arrivals": res.arrival_s[1],
        }

    gbps = real["link_gbps"]
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = registry_model(tmp, model_config(model_mb, blocks), blocks)
        block_s = manifest.total_bytes / blocks * 8 / (gbps * 1e9)
        for nodes, sources in ((2, 1), (real["nodes"], 1), (real["nodes"], 2)):
            for _ in range(reps):
                ccfg = LocalClusterConfig(
                    num_nodes=nodes, link_gbps=gbps, max_kv_tokens=2048, remote_dir=tmp / "reg"
                )
                with LocalCluster(ccfg) as cluster:
                    r = asyncio.run(multicast(cluster, manifest, nodes, sources))
                runs.setdefault(f"{nodes}x{sources}", []).append(r)
    two = runs["2x1"]
    per_block = [
        statistics.median(b - a for a, b in zip(r["arrivals"][:-1], r["arrivals"][1:], strict=True))
        for r in two
    ]
    first_block = statistics.median(r["arrivals"][0] for r in two)
    block_bytes = manifest.total_bytes / blocks
    # Effective rate in the multicast: planned block steps at the cap vs the measured end.
    ratios = [
        r["plan_steps"] * block_s / r["complete_s"]
        for key, rs in runs.items()
        if key != "2x1"
        for r in rs
    ]
    cpu = statistics.median(r["cpu_s_per_transfer"] for rs in runs.values() for r in rs)
    return {
        "link_cap_gbps": gbps,
        "one_block_s": round(statistics.median(per_block), 4),
        "first_block_s": round(first_block, 4),
        "one_link_gbps": round(block_bytes * 8 / statistics.median(per_block) / 1e9, 4),
        "multicast_complete_s": {
            k: [round(r["complete_s"], 3) for r in rs] for k, rs in runs.items() if k != "2x1"
        },
        "multicast_plan_s": {
            k: round(rs[0]["plan_steps"] * block_s, 3) for k, rs in runs.items() if k != "2x1"
        },
        "multicast_effective_gbps": round(gbps * statistics.median(ratios), 4),
        "cpu_s_per_transfer": round(cpu, 5),
        "transfer_cores": round(cpu / block_s, 4),
    }


def measure_endpoint_open(model_mb: float, blocks: int, real: dict, reps: int) -> dict:
    """Seconds, cores free, the runtime takes to open one endpoint while K hot instances
    serve the burst: every node holds the model already (loaded from its disk), K serve
    the burst's requests, then the planned pipelines and the other nodes' local instances
    open one after another, as the runtime's carrier of a multicast opens them (one action
    at a time). Per endpoint: `open()` (InstanceOpenOp / one StageOpenOp per stage and the
    head engines) and `add_endpoint` (its first requests dispatched), timed as wall
    seconds and as CPU seconds of the controller (this process) plus the opened agents
    (`/proc`, clock ticks). The CPU seconds are the cost with the cores free: the wall
    time on this shared machine also holds everyone else's work (other sessions' too),
    which the simulator's processor sharing (`shared_cores`) adds on its own."""
    from benchmarks.common import burst_cluster_config, model_config, registry_model, seed_disk
    from surge.config import EngineConfig
    from surge.engine.sampling import SamplingParams
    from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
    from surge.runtime.endpoints import LocalEndpoint
    from surge.runtime.launch.local import LocalCluster
    from surge.runtime.pipeline_endpoint import PipelineEndpoint
    from surge.runtime.protocol import LoadOp, RegisterOp
    from surge.runtime.scaleout.context import stage_layers
    from surge.runtime.server import Server

    nodes, k, batch = real["nodes"], real["sources"], real["max_num_seqs"]
    prompts = burst_prompts(real["requests"], tuple(real["prompt_len"]))
    params = SamplingParams(max_tokens=real["max_tokens"], ignore_eos=True)
    engine_cfg = EngineConfig(max_num_seqs=batch, max_kv_tokens=2048)

    def cpu_s(pids: list[int]) -> float:  # the agents' and this (controller) process's
        return processes_cpu_s(pids) + time.process_time()

    async def one_run(cluster: LocalCluster, manifest) -> tuple[list[list], list[list]]:
        client = cluster.client()
        await client.connect()
        await cluster.wire_peers(client)
        await client.broadcast(RegisterOp("m", manifest))
        load = LoadOp("m", tuple(range(blocks)), tier="gpu", source="disk")
        await asyncio.gather(*(client.call(n, load) for n in range(nodes)))
        server = Server(client, "m")
        pipes = plan_scale_out(
            MulticastRequest(num_nodes=nodes, num_blocks=blocks, num_sources=k)
        ).pipelines
        local, piped = [], []

        async def timed(ep, out: list) -> None:
            pids = [cluster.procs[n].pid for n in ep.nodes]
            t, c = time.monotonic(), cpu_s(pids)
            await ep.open()
            await server.add_endpoint(ep)
            out.append([round(time.monotonic() - t, 4), round(cpu_s(pids) - c, 4)])

        try:
            for n in range(k):
                hot = LocalEndpoint(client, n, "m", f"hot{n}", capacity=batch)
                await hot.open()
                await server.add_endpoint(hot)
            reqs = [server.new_request(p, params) for p in prompts]
            for r in reqs:
                await server.submit(r)
            for i, pipe in enumerate(pipes):
                stages = stage_layers(manifest, pipe)
                await timed(
                    PipelineEndpoint(client, manifest, "m", f"pipe{i}", stages, engine_cfg), piped
                )
            for i in range(len(pipes)):
                await server.retire(f"pipe{i}")  # as the mode switch does: they go local next
            for n in range(k, nodes):
                await timed(LocalEndpoint(client, n, "m", f"node{n}", capacity=batch), local)
            await server.wait_all(600)
        finally:
            await server.close()
            await client.close()
        return local, piped

    local, pipe = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = registry_model(tmp, model_config(model_mb, blocks), blocks)
        for _ in range(reps):
            ccfg = burst_cluster_config(nodes, real["link_gbps"], batch, tmp)
            with LocalCluster(ccfg) as cluster:
                for n in range(nodes):
                    seed_disk(cluster, n, "m", tmp / "reg" / "m", manifest)
                ls, ps = asyncio.run(one_run(cluster, manifest))
            local += ls
            pipe += ps
    return {
        "local_opens_wall_cpu_s": local,
        "pipeline_opens_wall_cpu_s": pipe,
        "local_open_wall_s": round(statistics.median(w for w, _ in local), 4),
        "pipeline_open_wall_s": round(statistics.median(w for w, _ in pipe), 4) if pipe else 0.0,
        "endpoint_open_s": round(statistics.median(c for _, c in local), 4),
        "pipeline_open_s": round(statistics.median(c for _, c in pipe), 4) if pipe else 0.0,
    }
