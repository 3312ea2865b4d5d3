"""Carrying out one scale-out of a deployment onto chosen nodes, by its strategy.

In: the deployment's `Server`, its manifest, the destination agents (chosen by
`surge.policy.placement`) and what the parameter pool says about sources. Out: local
instances opened on the destinations (through `on_local`), execution pipelines opened and
retired on the way, and the start kind (hot, warm, cold).

Locality-driven start-up (λScale §5):
- a destination holding a complete host copy loads it into its gpu tier itself (warm,
  local) and at once serves its host copy to others;
- the other destinations are fed by a multicast whose sources are the nodes with a
  complete gpu copy (hot) or host copy (warm);
- with no copy in memory anywhere (cold), one destination — a disk holder first — loads
  the model from its disk or the registry into its host tier (restoring BlitzScale's
  one-host-copy invariant) and then leads as a warm source.

Strategies: `lambdascale` (binomial multicast, pipelines open as blocks land, mode switch
to local instances), `blitzscale` (serial forwarding chains, same serve-while-loading),
`paraserve` (destinations fetch disjoint parts in parallel from their best local tier, serve
as one pipeline group, then consolidate: each fetches the rest and becomes a local
instance), `load-then-serve` (ServerlessLLM: each destination loads the whole model from its
best tier, then serves).

Unlike `surge.runtime.scale_out`, plan nodes map to arbitrary agents (sources are wherever
copies are), which the controller needs.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from surge.model.manifest import Manifest
from surge.policy.multicast import MulticastRequest, plan_scale_out
from surge.runtime.client import ClusterClient
from surge.runtime.multicast import MulticastExecutor
from surge.runtime.scale_out import stage_layers
from surge.runtime.serving import LocalEndpoint, PipelineEndpoint, Server

log = logging.getLogger(__name__)

PLAN_STRATEGY = {"lambdascale": "binomial", "blitzscale": "chain"}


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
    timeout_s: float = 120.0
    pipelines_opened: int = 0
    events: list[tuple[str, float]] = field(default_factory=list)


def instance_name(model: str, node: int) -> str:
    return f"{model}@{node}"


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


async def _open_local(ctx: ScaleOutContext, node: int) -> None:
    ep = LocalEndpoint(ctx.client, node, ctx.model, instance_name(ctx.model, node))
    await ep.open()
    await ctx.server.add_endpoint(ep)
    await ctx.on_local(node, ep)


async def _load_then_serve(ctx: ScaleOutContext, node: int) -> None:
    await _load(ctx, node, list(range(ctx.manifest.num_blocks)), _best_source(ctx, node))
    await _open_local(ctx, node)


async def run_scale_out(ctx: ScaleOutContext, dests: list[int]) -> str:
    """Bring `dests` up as local instances of the model; returns the start kind."""
    kind = start_kind(ctx, dests)
    if ctx.strategy == "load-then-serve":
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
        tasks.append(asyncio.ensure_future(_multicast_serve(ctx, sources, rest)))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return kind


async def _multicast_serve(ctx: ScaleOutContext, sources: list[int], dests: list[int]) -> None:
    """Multicast from `sources` to `dests` into the gpu tier, serving while it loads."""
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
    k = len(sources)
    events = ctx.client.listen()
    executor = MulticastExecutor(
        ctx.client,
        ctx.model,
        outcome.plan,
        agents=agents,
        tier="gpu",
        pipelines=outcome.pipelines,
        timeout_s=ctx.timeout_s,
    )
    holds = [set(range(b)) if v < k else set() for v in range(len(agents))]
    pending = list(enumerate(outcome.pipelines))
    open_pipes: dict[str, tuple[int, ...]] = {}
    opened_local: set[int] = set()
    task = asyncio.get_running_loop().create_task(executor.run())

    async def on_arrival(v: int, block: int) -> None:
        holds[v].add(block)
        for item in list(pending):
            index, pipe = item
            if any(len(holds[s.node]) == b for s in pipe.stages):
                pending.remove(item)  # a member is already whole: it serves alone instead
                continue
            if all(
                set(range(s.first_block, s.last_block + 1)) <= holds[s.node] for s in pipe.stages
            ):
                pending.remove(item)
                name = f"{ctx.model}-pipe-{executor.mc_id}-{index}"
                stages = [(agents[n], f, e) for n, f, e in stage_layers(ctx.manifest, pipe)]
                ep = PipelineEndpoint(ctx.client, ctx.manifest, ctx.model, name, stages)
                await ep.open()
                await ctx.server.add_endpoint(ep)
                open_pipes[name] = pipe.nodes
                ctx.pipelines_opened += 1
                ctx.events.append((name, time.monotonic()))
        if len(holds[v]) == b and v >= k and v not in opened_local:
            opened_local.add(v)
            await _open_local(ctx, agents[v])
            for pname, nodes in list(open_pipes.items()):
                if v in nodes:  # mode switch (λScale §4.4)
                    del open_pipes[pname]
                    await ctx.server.retire(pname)

    try:
        while not (task.done() and events.empty()):
            try:
                ev = await asyncio.wait_for(events.get(), 0.2)
            except TimeoutError:
                continue
            if ev.get("type") == "arrival" and ev.get("mc_id") == executor.mc_id:
                v = executor.node_of.get(ev["node"])
                if v is not None:
                    await on_arrival(v, ev["block"])
        task.result()
    finally:
        ctx.client.unlisten(events)
        if not task.done():
            task.cancel()
        for pname in list(open_pipes):  # a member died before completing: retire the rest
            await ctx.server.retire(pname)


async def _paraserve(ctx: ScaleOutContext, dests: list[int]) -> None:
    """Parallel fetch of disjoint parts, one pipeline group, then consolidation."""
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
    ep = PipelineEndpoint(ctx.client, ctx.manifest, ctx.model, name, stages)
    await ep.open()
    await ctx.server.add_endpoint(ep)
    ctx.pipelines_opened += 1

    async def consolidate(d: int, have: list[int]) -> None:
        rest = [x for x in range(b) if x not in have]
        await _load(ctx, d, rest, _best_source(ctx, d))
        await _open_local(ctx, d)

    try:
        await asyncio.gather(
            *(consolidate(d, p) for d, p in zip(group, parts, strict=True)),
            *(_load_then_serve(ctx, d) for d in others),
        )
    finally:
        await ctx.server.retire(name)
