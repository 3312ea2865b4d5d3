"""ParaServe cold starts (§4, §6): a pipeline group per instance, fetched in parallel.

In: the context (destinations = instances wanted, spare nodes with a free slot) and the
start-up plan (each destination's own tier). For each instance wanted, one group:
- `policy.paraserve.group_plan.plan_group` picks it: Alg. 2's contention-adjusted network
  shares (the workers already fetching on each node share its bandwidth), then Alg. 1's
  smallest size whose predicted TTFT/TPOT meet the deployment's SLOs, members in stage
  order, each with a contiguous part of the blocks balanced by bytes. A single cold start
  is thus fetched in parallel by several nodes. Members that are not destinations are
  booked with `hooks.book`; destinations no group uses are given back with `hooks.release`.
- the members fetch their parts at once, then serve together as one `PipelineEndpoint`;
- `policy.paraserve.predictor.consolidate_group` (§6.1, the deployment's arrivals in
  the system's `predictor_window_s`, and its queue; the simulator makes the same call)
  says how many members to keep: scale down to one, or scale up to several. The kept
  members fetch the rest and become local instances; the group's running requests move
  onto them with their KV caches (`runtime/migration/consolidation.py` `consolidate`); the other
  members' slots are released.
With `consolidation` `scale-up` every member is kept; with `group_sizing` `fixed` the group
is the destination and the first free nodes, `pipeline_size` in all or fewer
(`policy.paraserve.groups`: the groups, their fallback and the loop are policy's).

Stage times for Alg. 1 are estimates (ParaServe keeps historical ones; this runtime has none
before the first cold start), documented in docs/scaleout.md:
- `policy.paraserve.group_plan.alg1_inputs`, as in the simulator: t_c = the system's
  `init_s` (and t_cc, Eq. 5, when its start-up runs beside the fetch:
  `init_overlaps_load`); t_n = `stage_hop_s`;
- fetch at `ctx.fetch_gbps` (the controller's link speed), host-to-GPU at `PCIE_GBPS`;
- t_d = the model's bytes read once at `ctx.estimates`' weight-read rate (decode is memory
  bound), t_p = its `prefill_over_decode` x t_d (`scaleout/estimates.py`: rule-of-thumb
  constants, or the emulated GPU's cost model under GPU-time emulation);
- t_w = the longest wait among the requests queued now (measured).
"""

import asyncio
import logging
import math

from surge.errors import SurgeError
from surge.events import Consolidation, PipelineRetired
from surge.policy.paraserve.group_plan import GroupPlan, GroupRequest, alg1_inputs
from surge.policy.paraserve.groups import GroupsRequest
from surge.policy.paraserve.groups import plan_groups as policy_plan_groups
from surge.policy.paraserve.placement import FetchingWorker, ServerNetwork
from surge.policy.paraserve.predictor import GroupConsolidation, consolidate_group
from surge.policy.paraserve.prefetch import BACKGROUND, MemberPrefetch, plan_prefetch
from surge.policy.paraserve.sizing import GpuServer, SizingSettings, StageTimes
from surge.policy.startup import StartupPlan
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.consolidation import consolidate
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.protocol import LoadOp
from surge.runtime.scaleout.context import ScaleOutContext, group_name, layer_span
from surge.runtime.scaleout.estimates import DEFAULT_HOST_GBPS
from surge.runtime.scaleout.local import load_blocks, open_local, started

log = logging.getLogger(__name__)

PCIE_GBPS = DEFAULT_HOST_GBPS
"""Host-to-GPU rate assumed for Alg. 1's load term (`estimates.DEFAULT_HOST_GBPS`)."""


def alg1_inputs_of(ctx: ScaleOutContext) -> tuple[StageTimes, SizingSettings]:
    """Alg. 1's stage times and settings for this model (see the module docstring), by
    `policy.paraserve.group_plan.alg1_inputs`."""
    now = ctx.server.clock.now_s()
    decode_s = ctx.estimates.decode_s(ctx.manifest.total_bytes)
    wait_s = max((now - r.arrival_t for r in ctx.server.queue), default=0.0)
    return alg1_inputs(ctx.system, ctx.estimates.prefill_over_decode * decode_s, decode_s, wait_s)


def _networks(ctx: ScaleOutContext, nodes: list[int], now_s: float) -> tuple[ServerNetwork, ...]:
    return tuple(
        ServerNetwork(
            n,
            ctx.fetch_gbps,
            tuple(
                FetchingWorker(f"other{i}", math.inf, ctx.manifest.total_bytes)
                for i in range(ctx.fetching.get(n, 0))
            ),
            last_change_s=now_s,
        )
        for n in nodes
    )


def plan_groups(ctx: ScaleOutContext) -> list[GroupPlan]:
    """One group per destination, by `policy.paraserve.groups.plan_groups` (fewer when the
    nodes run out: more next tick); an error when not even one can form."""
    pool = [d.node for d in ctx.destinations] + [d.node for d in ctx.spares]
    now = ctx.server.clock.now_s()
    times, settings = alg1_inputs_of(ctx)
    alg1 = GroupRequest(
        block_bytes=tuple(b.size_bytes for b in ctx.manifest.blocks),
        servers=tuple(
            GpuServer(n, ctx.manifest.total_bytes, ctx.fetch_gbps, PCIE_GBPS) for n in pool
        ),
        times=times,
        ttft_slo_s=ctx.ttft_slo_s,
        tpot_slo_s=ctx.tpot_slo_s,
        settings=settings,
        networks=_networks(ctx, pool, now),
        now_s=now,
        model_id=ctx.model,
    )
    groups = policy_plan_groups(
        GroupsRequest(
            leaders=tuple(d.node for d in ctx.destinations),
            spares=tuple(d.node for d in ctx.spares),
            sizing=ctx.system.group_sizing,
            pipeline_size=ctx.system.pipeline_size,
            alg1=alg1,
        )
    )
    if not groups:
        raise SurgeError(
            f"{ctx.model}: no free node can take a ParaServe worker; free a slot or add nodes"
        )
    return list(groups)


async def run_groups(ctx: ScaleOutContext, plan: StartupPlan) -> None:
    """Every destination's instance comes up through a group (see the module docstring)."""
    groups = plan_groups(ctx)
    ctx.report.groups.extend(groups)
    dests = {d.node for d in ctx.destinations}
    used = {m for g in groups for m in g.members}
    tiers = {d.node: d.own_tier for d in (*ctx.destinations, *ctx.spares)}
    for local in plan.local:
        tiers[local.node] = local.source
    for m in sorted(used - dests):
        if not ctx.hooks.book(m):
            raise SurgeError(f"{ctx.model}: node {m}'s free slot was taken before its group began")
    for d in sorted(dests - used):
        await ctx.hooks.release(d)
    log.info("%s: groups %s", ctx.model, [(g.members, g.parts) for g in groups])
    results = await asyncio.gather(
        *(_run_group(ctx, g, tiers) for g in groups), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]


async def _run_group(ctx: ScaleOutContext, group: GroupPlan, tiers: dict[int, str]) -> None:
    members, parts = group.members, group.parts
    launch_s = ctx.server.clock.now_s()
    if len(members) == 1:
        await load_blocks(ctx, members[0], list(range(ctx.manifest.num_blocks)), tiers[members[0]])
        ctx.report.consolidations.append(group_consolidation(ctx, 1).decision)
        await started(ctx, launch_s)
        await open_local(ctx, members[0])
        return
    plans = prefetch_plans(ctx, group, tiers)
    prefetching: dict[int, asyncio.Task] = {}
    try:
        await asyncio.gather(*(_fetch_parts(ctx, plans[m], tiers[m], prefetching) for m in members))
    except BaseException:
        for task in prefetching.values():
            task.cancel()
        for m in members:
            await ctx.hooks.release(m)
        raise
    await started(ctx, launch_s)  # Eq. 5: the members' start runs beside their fetch
    stages = [
        (m, *layer_span(ctx.manifest, p[0], p[-1])) for m, p in zip(members, parts, strict=True)
    ]
    name = group_name(ctx.model, members)
    pipe = PipelineEndpoint(ctx.client, ctx.manifest, ctx.model, name, stages, ctx.engine)
    await pipe.open()
    await ctx.server.add_endpoint(pipe)
    ctx.record_open(name, pipe.nodes, stages)
    chosen = group_consolidation(ctx, len(members))
    ctx.report.consolidations.append(chosen.decision)
    keepers, others = members[: chosen.keep], members[chosen.keep :]
    log.info("%s: %s keeps %s (%s)", ctx.model, name, keepers, chosen.decision)
    try:
        await _consolidate(ctx, pipe, group, keepers, tiers, prefetching)
    finally:
        for m in others:  # not kept: their prefetch is of no use now
            if m in prefetching:
                prefetching[m].cancel()
        await ctx.server.retire(name)  # no-op once consolidated
        ctx.events.publish(PipelineRetired(model=ctx.model, name=name))
        for m in others:
            await ctx.hooks.release(m)


def prefetch_plans(
    ctx: ScaleOutContext, group: GroupPlan, tiers: dict[int, str]
) -> dict[int, MemberPrefetch]:
    """`policy.paraserve.prefetch` for this group, with the §6.1 prediction as it starts."""
    plans = plan_prefetch(
        group.members,
        group.parts,
        ctx.manifest.num_blocks,
        tuple(tiers[m] for m in group.members),
        ctx.system.consolidation,
        group_consolidation(ctx, len(group.members)).keep,
    )
    return {p.node: p for p in plans}


async def _fetch_parts(
    ctx: ScaleOutContext, plan: MemberPrefetch, source: str, prefetching: dict[int, asyncio.Task]
) -> None:
    """A member's node prefetcher (ParaServe §5 Fig. 6(b): "downloads two parts of model
    sequentially"): its own part into the gpu tier, then (if the plan says) the rest into
    its host tier as background traffic (§4.2: inference packets first), left running while
    the group serves; the rest is then a host copy the controller's host cache accounts."""
    await load_blocks(ctx, plan.node, list(plan.own), source)
    if plan.rest:
        op = LoadOp(
            model=ctx.model,
            blocks=plan.rest,
            tier="host",
            source=source,
            priority=BACKGROUND,  # type: ignore[arg-type]
        )
        started = ctx.server.clock.now_s()
        task = asyncio.get_running_loop().create_task(ctx.client.call(plan.node, op))
        task.add_done_callback(
            lambda t: (
                t.cancelled()
                or t.exception()
                or ctx.report.prefetched.append((plan.node, started, ctx.server.clock.now_s()))
            )
        )
        prefetching[plan.node] = task


def group_consolidation(ctx: ScaleOutContext, size: int) -> GroupConsolidation:
    """§6.1 for a group of `size` members that has served, on the deployment's arrivals
    and queue (`policy.paraserve.predictor.consolidate_group`)."""
    server = ctx.server
    now_s = server.clock.now_s()
    return consolidate_group(ctx.system, tuple(server.arrivals), now_s, len(server.queue), size)


async def _consolidate(
    ctx: ScaleOutContext,
    pipe: PipelineEndpoint,
    group: GroupPlan,
    keepers: tuple[int, ...],
    tiers: dict[int, str],
    prefetching: dict[int, asyncio.Task],
) -> None:
    """Kept members load the rest and open; the group's requests move onto them. A member
    whose node prefetched the rest loads it from its host tier (the parameter manager,
    ParaServe §5-§6: over PCIe, not the network); one whose prefetch failed, or that had
    none, fetches it from its own tier."""
    part_of = dict(zip(group.members, group.parts, strict=True))
    b = ctx.manifest.num_blocks

    async def fetch_rest(m: int) -> LocalEndpoint:
        rest = [x for x in range(b) if x not in part_of[m]]
        source = tiers[m]
        if m in prefetching:
            try:
                await prefetching[m]
                source = "host"
            except Exception as e:  # the registry still has it
                log.warning("%s: node %d's prefetch failed (%s); fetching", ctx.model, m, e)
        await load_blocks(ctx, m, rest, source)
        ep = ctx.local_endpoint(m)
        await ep.open()
        return ep

    fetched = await asyncio.gather(*(fetch_rest(m) for m in keepers), return_exceptions=True)
    targets = [t for t in fetched if isinstance(t, LocalEndpoint)]
    if targets and pipe.name in ctx.server.endpoints and not pipe.failed:
        inflight = list(pipe.requests.values())
        try:
            counts = await consolidate(ctx.server, pipe, targets)
            ctx.report.kv_migrated += counts["migrated"]
            ctx.report.consolidated += 1
            nodes = tuple(t.node for t in targets)
            ev = Consolidation(
                model=ctx.model, name=pipe.name, targets=nodes, num_migrated=counts["migrated"]
            )
            ctx.events.publish(ev)
            log.info("%s consolidated onto %s: %s", pipe.name, [t.node for t in targets], counts)
        except Exception as e:  # a target died mid-way: nothing may be lost
            log.warning("consolidation of %s failed (%s); re-routing", pipe.name, e)
            await ctx.server.requeue(inflight)
            await pipe.close_stages()
    else:
        for t in targets:
            await ctx.server.add_endpoint(t)
    for t in targets:
        ctx.record_open(t.name, t.nodes)
        await ctx.hooks.on_local(t.node, t)
    for m, r in zip(keepers, fetched, strict=True):
        if isinstance(r, BaseException):
            await ctx.hooks.release(m)
    errors = [r for r in fetched if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
