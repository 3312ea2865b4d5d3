"""One burst on K hot instances, scaled out to the other nodes: the run the scale-out
benchmarks share (`scale_burst.py`, `emulation/lambdascale.py`, `emulation/lambdascale_fig12.py`).

In: a started cluster, the real model's manifest, a mode (`MODES`: λScale serving while
loading or not; `LOAD_THEN_SERVE`: ServerlessLLM, each new node loads alone) and the system
whose start-up plan and multicast carry the scale-out out (default λScale; λScale §7's
baselines: FaaSNet's binary tree, NCCL's chain after its group creation). Out: TTFT
percentiles, endpoints opened, mode switches, the multicast's end and a token-rate timeline,
in the serving clock's seconds from the burst (emulated seconds on an emulated clock).
"""

import asyncio
import random
import statistics
import time
from dataclasses import replace

from benchmarks.common import cores_during, cpu_s
from surge.config import EngineConfig
from surge.engine.sampling import SamplingParams
from surge.model.manifest import Manifest
from surge.policy.startup import Copy, Destination
from surge.policy.systems import SystemConfig, system_config
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.launch.local import LocalCluster
from surge.runtime.multicast import MulticastResult
from surge.runtime.protocol import LoadOp, RegisterOp, Source
from surge.runtime.scaleout import ControllerHooks, ScaleOutContext, run_scale_out
from surge.runtime.server import Server

MODEL = "burst"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timeline(reqs, start: float, bucket_s: float) -> list[list[float]]:
    times = [t - start for r in reqs for t in r.token_times]
    if not times:
        return []
    num = int(max(times) / bucket_s) + 1
    counts = [0] * num
    for t in times:
        counts[int(t / bucket_s)] += 1
    return [[round(i * bucket_s, 3), round(c / bucket_s, 2)] for i, c in enumerate(counts)]


def block_landed(result: MulticastResult | None, clock: Clock) -> list[list[float]] | None:
    """Per block, when the first and the last receiver held it, in `clock`'s seconds from
    the multicast's start (the scale-out starts with the burst): the runtime side of the
    block timeline the simulator's `BlockLanded` events give (`sim_calibrate.predict`)."""
    if result is None:
        return None
    k = result.plan.num_sources
    out = []
    for b in range(result.plan.num_blocks):
        got = [row[b] for row in result.arrival_s[k:] if row[b] is not None]
        out.append([round(clock.of_real(min(got)), 4), round(clock.of_real(max(got)), 4)]
                   if got else [])  # fmt: skip
    return out


def block_arrivals(result: MulticastResult | None, clock: Clock) -> list[list[float | None]] | None:
    """Per plan node (sources first), when it held each block, in `clock`'s seconds from the
    multicast's start (None: never): the whole matrix behind `block_landed` (λScale Fig. 8
    plots it per node)."""
    if result is None:
        return None
    return [
        [None if t is None else round(clock.of_real(t), 4) for t in row] for row in result.arrival_s
    ]


def group_times(result: MulticastResult | None, clock: Clock) -> dict | None:
    """A gloo group broadcast's measured times (`runtime/collective.py`; None without one):
    real seconds as measured, and in `clock`'s seconds."""
    g = result.group if result is not None else None
    if g is None:
        return None
    return {
        # under emulation at least the system's group_setup_s (`paced_setups`)
        "setup_real_s": g.setup_s,
        "setup_s": clock.of_real(g.setup_s) if g.setup_s is not None else None,
        "member_setup_real_s": list(g.member_setup_s),
        "broadcast_real_s": g.broadcast_s,
        "broadcast_s": clock.of_real(g.broadcast_s) if g.broadcast_s is not None else None,
        "bytes_per_target": g.num_bytes,
        "errors": list(g.errors),
        "fell_back": g.fell_back,
    }


MODES = ("execute_while_load", "stop_the_world")
"""Serve while loading (λScale pipelines + mode switch) or only once whole."""
LOAD_THEN_SERVE = "load_then_serve"
"""ServerlessLLM: every new node reads the model from its own disk at --disk-gbps (no
multicast), and serves once it holds all of it (`--modes ...,load_then_serve`)."""
LINK_OVER_DISK = 10
"""Default disk rate = link rate / this: λScale's testbed (Table 1) has 400 Gb/s InfiniBand
(50 GB/s) and 5 GB/s NVMe per node."""


async def load_then_serve(
    client,
    server: Server,
    manifest: Manifest,
    args,
    opened: list,
    source: Source = "remote",
    engine_start_s: float = 0.0,
) -> None:
    """Each destination loads the whole model from `source`, starts its engine
    (`engine_start_s` on the serving clock: a system's `init_s`), then serves alone."""
    blocks = tuple(range(manifest.num_blocks))

    async def one(node: int) -> None:
        await client.call(node, LoadOp(model=MODEL, blocks=blocks, source=source, tier="gpu"))
        await server.clock.sleep(engine_start_s)
        ep = LocalEndpoint(client, node, MODEL, f"{MODEL}-node{node}", capacity=args.max_num_seqs)
        await ep.open()
        await server.add_endpoint(ep)
        opened.append((ep.name, server.clock.now_s(), (node,)))

    await asyncio.gather(*(one(n) for n in range(args.sources, args.nodes)))


async def _serving(node: int, ep: LocalEndpoint) -> None:
    """A destination serves alone (the benchmark has no controller to tell)."""


async def burst(
    cluster: LocalCluster,
    manifest: Manifest,
    mode: str,
    args,
    hot_from: Source = "disk",
    system: SystemConfig | None = None,
    clock: Clock = REAL_CLOCK,
    load_from: Source = "remote",
    paced_setups: bool = False,
) -> dict:
    """One burst on `args.sources` hot instances (loaded from `hot_from` before the clock
    starts) scaled out to every other node in `mode` by `system` (default: λScale, every
    hot instance a source; `LOAD_THEN_SERVE`: each node loads from `load_from` and starts
    its engine for `system.init_s`); times in `clock`'s seconds from the burst (an
    emulated clock: emulated seconds; `args.bucket_s` too). `paced_setups`: under
    emulation, a gloo group's creation lasts at least `system.group_setup_s` on `clock`
    (`ScaleOutContext.paced_setups`)."""
    client = cluster.client()
    await client.connect()
    await cluster.wire_peers(client)
    await client.broadcast(RegisterOp(model=MODEL, manifest=manifest))
    blocks = tuple(range(manifest.num_blocks))
    await asyncio.gather(
        *(
            client.call(src, LoadOp(model=MODEL, blocks=blocks, source=hot_from, tier="gpu"))
            for src in range(args.sources)
        )
    )
    server = Server(client, MODEL, clock=clock)
    engine = EngineConfig(max_num_seqs=args.max_num_seqs, max_kv_tokens=2048)
    if system is None:  # λScale's binomial plan and pipelines, every hot instance a source
        system = replace(system_config("lambdascale"), max_sources=args.sources)
    try:
        for src in range(args.sources):
            hot = LocalEndpoint(
                client, src, MODEL, f"{MODEL}-node{src}", capacity=args.max_num_seqs
            )
            await hot.open()
            await server.add_endpoint(hot)
        rng = random.Random(0)
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        lo, hi = args.prompt_len
        reqs = [
            server.new_request([rng.randrange(2, 500) for _ in range(rng.randint(lo, hi))], params)
            for _ in range(args.requests)
        ]
        ctx = ScaleOutContext(
            client,
            server,
            manifest,
            system,
            tuple(Destination(n) for n in range(args.sources, args.nodes)),
            ControllerHooks(on_local=_serving),
            copies=tuple(Copy(n, "gpu") for n in range(args.sources)),
            engine=engine,
            timeout_s=600,
            serve_while_loading=mode == "execute_while_load",
            paced_setups=paced_setups,
        )
        pids = {n: proc.pid for n, proc in getattr(cluster, "procs", {}).items()}
        cpu_before = (time.process_time(), cpu_s(pids))
        start_real, start = time.monotonic(), clock.now_s()
        # The burst and the scale-out both start at t=0: the scale-out does not wait for
        # the hot instances to take their first requests (16 calls at K=4, ~20-70 ms on
        # quarter-core nodes, were counted into its first new capacity).
        if mode == LOAD_THEN_SERVE:
            scaling = load_then_serve(
                client, server, manifest, args, ctx.report.opened, load_from, system.init_s
            )
        else:
            scaling = run_scale_out(ctx)
        scale_task = asyncio.get_running_loop().create_task(scaling)
        for r in reqs:
            await server.submit(r)
        submitted_s = clock.now_s() - start
        await scale_task
        await server.wait_all(600)
        cpu_after = (time.process_time(), cpu_s(pids))
        wall_s = time.monotonic() - start_real
        ttft = [r.first_token_t - r.arrival_t for r in reqs]
        done = max(r.done_t for r in reqs) - start
        return {
            "ttft_p50_s": round(percentile(ttft, 0.5), 4),
            "ttft_p90_s": round(percentile(ttft, 0.9), 4),
            "ttft_p99_s": round(percentile(ttft, 0.99), 4),
            "ttft_max_s": round(max(ttft), 4),
            "ttft_mean_s": round(statistics.mean(ttft), 4),
            "all_requests_done_s": round(done, 4),
            # the executor's times are real seconds from its own start
            "multicast_complete_s": clock.of_real(ctx.report.multicast.complete_s)
            if ctx.report.multicast and ctx.report.multicast.complete_s is not None
            else None,
            "group": group_times(ctx.report.multicast, clock),
            "block_landed_s": block_landed(ctx.report.multicast, clock),
            "block_arrival_s": block_arrivals(ctx.report.multicast, clock),
            "endpoints_opened": [
                [n, round(t - start, 3), list(nodes)] for n, t, nodes in ctx.report.opened
            ],
            "mode_switches": [
                [n, round(t - start, 3), moved] for n, t, moved in ctx.report.retired
            ],
            "requests_via_pipelines": sum(any("pipe" in h for h in r.hops) for r in reqs),
            "tokens_per_s_timeline": timeline(reqs, start, args.bucket_s),
            "burst_submitted_s": round(submitted_s, 4),
            "cores_during_burst": cores_during(cpu_before, cpu_after, wall_s),
        }
    finally:
        await server.close()
        await client.close()
