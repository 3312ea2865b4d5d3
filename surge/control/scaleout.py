"""Carrying out one scale-out of a deployment onto chosen nodes, by its strategy.

In: the deployment's `Server`, its manifest, the destination agents (chosen by
`surge.policy.placement`) and what the parameter pool says about sources. Out: local
instances opened on the destinations (reported through `on_local`), execution pipelines
opened and retired on the way, and the start kind (hot, warm, cold).

Locality-driven start-up (λScale §5):
- a destination holding a complete host copy loads it into its gpu tier itself (warm,
  local) and at once serves its host copy to others;
- the other destinations are fed by a multicast whose sources are the nodes with a
  complete gpu copy (hot) or host copy (warm);
- with no copy in memory anywhere (cold), one destination — a disk holder first — loads
  the model from its disk or the registry into its host tier (restoring BlitzScale's
  one-host-copy invariant) and then leads as a warm source.

Strategies (the mechanisms live in `surge.runtime`; this module only picks sources, plans
and hands over):
- `lambdascale`: binomial multicast run by `surge.runtime.scale_out.scale_out`
  (execute-while-load: pipelines open as blocks land, mode switch to local instances);
- `blitzscale`: the same with BlitzScale's serial forwarding chains, plus live scaling
  (BlitzScale §4, §5.2) while a destination loads: queued requests are prefilled with the
  first T layers on the new node and the rest on a serving instance, which decodes them
  (`surge.runtime.consolidation.live_prefill`, T from `surge.policy.zigzag.best_effort`
  clipped to the layers the new node holds);
- `paraserve` (ParaServe §4, §6): destinations fetch disjoint block ranges in parallel from
  their best tier, serve as one pipeline group, fetch the rest, then consolidate by KV
  migration onto every member (`surge.runtime.consolidation.consolidate`);
- `load-then-serve` (ServerlessLLM): each destination loads the whole model from its best
  tier, then serves.
"""

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from surge.config import EngineConfig
from surge.model.manifest import Manifest
from surge.policy.multicast import MulticastRequest, plan_scale_out
from surge.policy.zigzag import ZigzagProblem, best_effort
from surge.runtime.client import ClusterClient
from surge.runtime.consolidation import consolidate, live_prefill
from surge.runtime.scale_out import scale_out
from surge.runtime.serving import Endpoint, LocalEndpoint, PipelineEndpoint, Server, ServeRequest

log = logging.getLogger(__name__)

PLAN_STRATEGY = {"lambdascale": "binomial", "blitzscale": "chain"}

LIVE_BATCH = 4
"""Queued requests prefilled together by one live-scaling step."""
LIVE_LOAD_RATIO = 1.0
"""Zigzag's Time_l (layer load time / layer execution time) for the schedule's shape; the
real limit is applied at each batch: the layers the new node holds (C3, measured)."""


@dataclass
class ScaleOutContext:
    """Everything one scale-out needs from the controller."""

    client: ClusterClient
    server: Server
    manifest: Manifest
    model: str
    strategy: str
    hot: list[int]
    """Nodes (not destinations) with a complete gpu copy."""
    warm: list[int]
    """Nodes (not destinations) with a complete host copy."""
    local_host: set[int]
    """Destinations with a complete host copy of their own."""
    local_disk: set[int]
    """Destinations with a complete disk copy of their own."""
    on_local: Callable[[int, LocalEndpoint], Awaitable[None]]
    """Called when a destination serves alone."""
    make_host_copy: Callable[[int], Awaitable[None]]
    """Load the model into a node's host tier from its disk or the registry (cold leader)."""
    engine: EngineConfig = EngineConfig()
    timeout_s: float = 120.0
    serve_while_loading: bool = True
    """False: multicast destinations serve only once whole (`stop_the_world`); the
    controller sets it when another multicast of the same model still has pipelines."""
    pipelines_opened: int = 0
    kv_migrated: int = 0
    """Requests moved with their KV cache (consolidation)."""
    live_prefilled: int = 0
    """Requests prefilled cooperatively by live scaling."""
    events: list[tuple[str, float]] = field(default_factory=list)


def instance_name(model: str, node: int) -> str:
    """The local instance of `model` on `node` (the name `surge.runtime.scale_out` uses)."""
    return f"{model}-node{node}"


def start_kind(ctx: ScaleOutContext, dests: list[int]) -> str:
    if ctx.hot:
        return "hot"
    if ctx.warm or ctx.local_host & set(dests):
        return "warm"
    return "cold"


async def _load(ctx: ScaleOutContext, node: int, blocks: list[int], source: str) -> None:
    await ctx.client.request(
        node,
        {"op": "load", "model": ctx.model, "blocks": blocks, "source": source, "tier": "gpu"},
    )


def _best_source(ctx: ScaleOutContext, node: int) -> str:
    if node in ctx.local_host:
        return "host"
    return "disk" if node in ctx.local_disk else "remote"


def _local_endpoint(ctx: ScaleOutContext, node: int) -> LocalEndpoint:
    return LocalEndpoint(
        ctx.client,
        node,
        ctx.model,
        instance_name(ctx.model, node),
        capacity=ctx.engine.max_num_seqs,
    )


async def _open_local(ctx: ScaleOutContext, node: int) -> None:
    ep = _local_endpoint(ctx, node)
    await ep.open()
    await ctx.server.add_endpoint(ep)
    await ctx.on_local(node, ep)


async def _load_then_serve(ctx: ScaleOutContext, node: int) -> None:
    await _load(ctx, node, list(range(ctx.manifest.num_blocks)), _best_source(ctx, node))
    await _open_local(ctx, node)


async def run_scale_out(ctx: ScaleOutContext, dests: list[int]) -> str:
    """Bring `dests` up as local instances of the model; returns the start kind."""
    kind = start_kind(ctx, dests)
    if ctx.strategy == "serverlessllm":
        await asyncio.gather(*(_load_then_serve(ctx, d) for d in dests))
        return kind
    if ctx.strategy == "paraserve":
        await _paraserve(ctx, dests)
        return kind
    # lambdascale / blitzscale: warm-local first, then a multicast to the rest.
    local = [d for d in dests if d in ctx.local_host]
    rest = [d for d in dests if d not in ctx.local_host]
    sources = list(dict.fromkeys([*ctx.hot, *ctx.warm, *local]))
    tasks = [asyncio.ensure_future(_load_then_serve(ctx, d)) for d in local]
    if rest and not sources:  # cold: a leader brings the model into its host tier first
        leader = min(rest, key=lambda d: (d not in ctx.local_disk, d))
        await ctx.make_host_copy(leader)
        ctx.local_host.add(leader)
        rest.remove(leader)
        sources = [leader]
        tasks.append(asyncio.ensure_future(_load_then_serve(ctx, leader)))
    if rest:
        sources = sources[: len(rest)]  # more sources than receivers buy nothing
        tasks.append(asyncio.ensure_future(_multicast(ctx, sources, rest)))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return kind


class _ReportingServer:
    """The deployment's `Server` as `surge.runtime.scale_out` sees it: every local instance
    it opens is also reported to the controller (`on_local`)."""

    def __init__(self, ctx: ScaleOutContext) -> None:
        self._ctx = ctx
        self.client, self.model = ctx.server.client, ctx.server.model

    async def add_endpoint(self, ep: Endpoint) -> None:
        await self._ctx.server.add_endpoint(ep)
        if isinstance(ep, LocalEndpoint):
            await self._ctx.on_local(ep.node, ep)
        else:
            self._ctx.pipelines_opened += 1
            self._ctx.events.append((ep.name, time.monotonic()))

    async def retire(self, name: str) -> list[ServeRequest]:
        return await self._ctx.server.retire(name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._ctx.server, attr)


async def _multicast(ctx: ScaleOutContext, sources: list[int], dests: list[int]) -> None:
    """Multicast from `sources` to `dests` into the gpu tier with the runtime's
    `scale_out` (plan node i = agents[i], sources first), serving while it loads."""
    b = ctx.manifest.num_blocks
    agents = [*sources, *dests]
    outcome = plan_scale_out(
        MulticastRequest(
            num_nodes=len(agents),
            num_blocks=b,
            num_sources=len(sources),
            strategy=PLAN_STRATEGY[ctx.strategy],
            block_bytes=max(1, ctx.manifest.total_bytes // b),
        )
    )
    mode = "execute_while_load" if ctx.serve_while_loading else "stop_the_world"
    live = None
    if ctx.strategy == "blitzscale":
        live = asyncio.ensure_future(_live_scaling(ctx, dests))
    try:
        await scale_out(
            cast(Server, _ReportingServer(ctx)),
            ctx.manifest,
            outcome,
            mode=mode,
            engine=ctx.engine,
            timeout_s=ctx.timeout_s,
            agents=agents,
        )
    finally:
        if live is not None:
            live.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await live
        if mode == "execute_while_load":  # a member died before completing: retire the rest
            for name, ep in list(ctx.server.endpoints.items()):
                if isinstance(ep, PipelineEndpoint) and name.startswith(f"{ctx.model}-pipe"):
                    await ctx.server.retire(name)


def _held_layers(manifest: Manifest, blocks: set[int]) -> int:
    """Layers 0..n-1 that a node can run: the end layer of its longest block prefix."""
    k = 0
    while k in blocks:
        k += 1
    return manifest.blocks[k - 1].end_layer if k else 0


async def _live_scaling(ctx: ScaleOutContext, dests: list[int]) -> None:
    """BlitzScale live scaling (§4, §5.2) for as long as `dests` load.

    While a destination holds a prefix of the layers but not all of them, and requests that
    have not started wait in the deployment's queue, batches of them are prefilled
    cooperatively: the first T layers on the destination, the rest on a serving local
    instance (the overloaded "old" one), which then decodes them with the whole KV cache.
    T_i comes from the paper's best-effort zigzag schedule (`policy.zigzag.best_effort`),
    clipped to the layers the destination holds at that moment. Runs until cancelled (the
    multicast is over); a failed step puts its requests back at the head of the queue."""
    manifest, server = ctx.manifest, ctx.server
    num_layers = manifest.arch.num_layers
    held: dict[int, set[int]] = {d: set() for d in dests}
    events = ctx.client.listen()
    splits: list[tuple[int, int]] = []
    try:
        while True:
            evs = []
            with contextlib.suppress(TimeoutError):
                evs.append(await asyncio.wait_for(events.get(), 0.05))
            while not events.empty():  # token events flow all the time: drain, then decide
                evs.append(events.get_nowait())
            for ev in evs:
                if (
                    ev.get("type") == "arrival"
                    and ev.get("model") == ctx.model
                    and ev.get("tier") == "gpu"
                    and ev.get("node") in held
                ):
                    held[ev["node"]].add(ev["block"])
            olds = [
                e
                for e in server.endpoints.values()
                if isinstance(e, LocalEndpoint) and not e.failed and e.node not in held
            ]
            waiting = [r for r in server.queue if not r.output_token_ids and not r.done.is_set()]
            layers = {
                d: _held_layers(manifest, b)
                for d, b in held.items()
                if len(b) < manifest.num_blocks and d not in ctx.client.down
            }
            if not olds or not waiting or not layers:
                continue
            new = max(layers, key=lambda d: (layers[d], -d))
            if layers[new] < 1:
                continue
            if not splits:  # a fresh schedule for the batches waiting now
                problem = ZigzagProblem(
                    num_layers=num_layers,
                    load_ratio=LIVE_LOAD_RATIO,
                    num_batches=max(1, math.ceil(len(waiting) / LIVE_BATCH)),
                    resident_layers_at_start=min(layers[new], num_layers),
                )
                splits = list(best_effort(problem).splits)
            t = min(splits.pop(0)[0], layers[new], num_layers - 1)
            if t < 1:
                continue  # this batch runs on the old instance alone (normal routing)
            old = min(olds, key=lambda e: (e.outstanding, e.name))
            batch = waiting[:LIVE_BATCH]
            server.queue[:] = [r for r in server.queue if r not in batch]
            try:
                await live_prefill(server, manifest, new, old, t, batch)
                ctx.live_prefilled += len(batch)
            except Exception as e:
                log.info("live prefill on node %d failed (%s); requests re-queued", new, e)
                back = [r for r in batch if not r.done.is_set() and r.req_id not in old.requests]
                server.queue[:0] = back
                await server._dispatch()
    finally:
        ctx.client.unlisten(events)


async def _paraserve(ctx: ScaleOutContext, dests: list[int]) -> None:
    """ParaServe (§4, §6): parallel fetch of disjoint parts, one pipeline group serving at
    once, then consolidation by KV migration onto every member that loaded the rest."""
    b = ctx.manifest.num_blocks
    group = dests[: min(len(dests), b)]
    others = dests[len(group) :]
    if len(group) < 2:
        await asyncio.gather(*(_load_then_serve(ctx, d) for d in dests))
        return
    # Contiguous, nearly equal block ranges, one per group member, in layer order.
    cuts = [round(i * b / len(group)) for i in range(len(group) + 1)]
    parts = [list(range(cuts[i], cuts[i + 1])) for i in range(len(group))]
    await asyncio.gather(
        *(_load(ctx, d, p, _best_source(ctx, d)) for d, p in zip(group, parts, strict=True))
    )
    blocks = ctx.manifest.blocks
    stages = [
        (d, blocks[p[0]].first_layer, blocks[p[-1]].end_layer)
        for d, p in zip(group, parts, strict=True)
    ]
    name = f"{ctx.model}-pgroup-{'-'.join(map(str, group))}-{time.monotonic_ns()}"
    pipe = PipelineEndpoint(ctx.client, ctx.manifest, ctx.model, name, stages, ctx.engine)
    await pipe.open()
    await ctx.server.add_endpoint(pipe)
    ctx.pipelines_opened += 1
    ctx.events.append((name, time.monotonic()))

    async def fetch_rest(d: int, have: list[int]) -> LocalEndpoint:
        await _load(ctx, d, [x for x in range(b) if x not in have], _best_source(ctx, d))
        ep = _local_endpoint(ctx, d)
        await ep.open()
        return ep

    extra = asyncio.gather(*(_load_then_serve(ctx, d) for d in others), return_exceptions=True)
    fetched = await asyncio.gather(
        *(fetch_rest(d, p) for d, p in zip(group, parts, strict=True)), return_exceptions=True
    )
    targets = [t for t in fetched if isinstance(t, LocalEndpoint)]
    try:
        if targets and name in ctx.server.endpoints and not pipe.failed:
            inflight = list(pipe.requests.values())
            try:
                counts = await consolidate(ctx.server, pipe, targets)
                ctx.kv_migrated += counts["migrated"]
                log.info("%s consolidated onto %s: %s", name, [t.node for t in targets], counts)
            except Exception as e:  # a target died mid-way: nothing may be lost
                log.warning("consolidation of %s failed (%s); re-routing", name, e)
                await _requeue_orphans(ctx.server, inflight)
                await pipe.close_stages()
        else:
            for t in targets:
                await ctx.server.add_endpoint(t)
        for t in targets:
            await ctx.on_local(t.node, t)
    finally:
        await ctx.server.retire(name)  # no-op when consolidated
    errors = [r for r in [*fetched, *await extra] if isinstance(r, BaseException)]
    if errors:
        raise errors[0]


async def _requeue_orphans(server: Server, reqs: list[ServeRequest]) -> None:
    """Route again every request that is unfinished, not queued and on no endpoint."""
    on_endpoint = {rid for e in server.endpoints.values() for rid in e.requests}
    queued = {r.req_id for r in server.queue}
    back = [
        r
        for r in reqs
        if not r.done.is_set() and r.req_id not in on_endpoint and r.req_id not in queued
    ]
    server.queue[:0] = back
    await server._dispatch()
