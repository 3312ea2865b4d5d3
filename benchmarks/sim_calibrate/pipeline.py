"""How fast an execution pipeline serves compared with a local instance, in the runtime.

What flows: a 64-MB, 16-block model on 3 agents of a `LocalCluster` (all hold it); the
first planned pipeline of the burst's multicast (`policy.multicast.scale_out.plan_scale_out`, 8
nodes, K=1) opened as a `PipelineEndpoint` (2 micro-batch streams of `max_num_seqs`)
over them, then a `LocalEndpoint` on one agent alone; the same burst of requests on each.
Out: wall seconds, CPU seconds of the agents and the controller, and the pipeline's
throughput relative to the local instance. `benchmarks/sim_calibrate/main.py` records it as a
diagnostic: the simulator serves a pipeline as one batch of micro-batches x
`max_batch` at an instance's step cost plus a hop per stage boundary.
"""

import asyncio
import tempfile
import time
from pathlib import Path


def measure_pipeline_serving(model_mb: float, blocks: int, real: dict, requests: int = 32) -> dict:
    """Burst wall and CPU seconds on the planned pipeline vs on one local instance."""
    from benchmarks.common import model_config, registry_model, seed_disk
    from benchmarks.sim_calibrate.measure import burst_prompts, processes_cpu_s
    from surge.config import EngineConfig
    from surge.engine.sampling import SamplingParams
    from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
    from surge.runtime.endpoints import LocalEndpoint
    from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
    from surge.runtime.pipeline_endpoint import PipelineEndpoint
    from surge.runtime.protocol import LoadOp, RegisterOp
    from surge.runtime.scaleout.context import stage_layers
    from surge.runtime.server import Server

    batch = real["max_num_seqs"]
    pipe = plan_scale_out(
        MulticastRequest(num_nodes=real["nodes"], num_blocks=blocks, num_sources=1)
    ).pipelines[0]
    nodes = len(pipe.stages)

    def agents_cpu_s(cluster: LocalCluster) -> float:
        return processes_cpu_s([proc.pid for proc in cluster.procs.values()])

    async def burst(cluster: LocalCluster, manifest, kind: str) -> dict:
        client = cluster.client()
        await client.connect()
        await cluster.wire_peers(client)
        await client.broadcast(RegisterOp("m", manifest))
        load = LoadOp("m", tuple(range(blocks)), tier="gpu", source="disk")
        await asyncio.gather(*(client.call(n, load) for n in range(nodes)))
        server = Server(client, "m")
        if kind == "pipeline":
            stages = [(i, a, b) for i, (_, a, b) in enumerate(stage_layers(manifest, pipe))]
            cfg = EngineConfig(max_num_seqs=batch, max_kv_tokens=2048)
            ep = PipelineEndpoint(client, manifest, "m", "p", stages, cfg)
        else:
            ep = LocalEndpoint(client, 0, "m", "l", capacity=batch)
        params = SamplingParams(max_tokens=real["max_tokens"], ignore_eos=True)
        reqs = [server.new_request(p, params) for p in burst_prompts(requests, (4, 12))]
        try:
            await ep.open()
            await server.add_endpoint(ep)
            c0, p0, t0 = agents_cpu_s(cluster), time.process_time(), time.monotonic()
            for r in reqs:
                await server.submit(r)
            await server.wait_all(600)
            wall = time.monotonic() - t0
            cpu = agents_cpu_s(cluster) - c0 + time.process_time() - p0
        finally:
            await server.close()
            await client.close()
        return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "cores": round(cpu / wall, 3)}

    out: dict = {"stages": nodes, "requests": requests, "max_num_seqs": batch}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        manifest = registry_model(tmp, model_config(model_mb, blocks), blocks)
        for kind in ("pipeline", "local"):
            ccfg = LocalClusterConfig(
                num_nodes=nodes, max_num_seqs=batch, max_kv_tokens=2048, remote_dir=tmp / "reg"
            )
            with LocalCluster(ccfg) as cluster:
                for n in range(nodes):
                    seed_disk(cluster, n, "m", tmp / "reg" / "m", manifest)
                out[kind] = asyncio.run(burst(cluster, manifest, kind))
    ratio = out["local"]["wall_s"] / out["pipeline"]["wall_s"]
    out["pipeline_throughput_vs_local"] = round(ratio, 3)
    return out


def profile_pipeline_vs_local(engine: dict, stages: int, micro_batches: int, batch: int) -> float:
    """The same ratio in the simulator's model (decode steps): a pipeline runs one batch of
    micro_batches x batch at the profile's step cost plus a hop per stage boundary, a local
    instance a batch of `batch`."""
    c, n = engine["per_layer_s"], engine["num_layers"]

    def step_s(b: int) -> float:
        return n * (c["decode_fixed"] + c["decode_per_seq"] * b)

    hops = (stages - 1) * engine["agent_round_trip_per_step_s"]
    big = micro_batches * batch
    return round((big / (step_s(big) + hops)) / (batch / step_s(batch)), 3)
