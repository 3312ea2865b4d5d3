"""Carrying out one scale-out: the start-up plan of `surge.policy.startup`, field by field.

In: a `ScaleOutContext` (controller-built: destinations with their own tiers, copies
elsewhere, the system). Out: every destination serving as a local instance (reported
through `hooks.on_local`), with whatever the system serves on the way, recorded on the
context; returns the start kind (hot, warm, cold).

First, destinations whose host group already holds a device copy of the model open it
instead of loading one (`policy.copies.mate_copies`; `scaleout/local.open_mate_then_serve`), and
the start-up plan covers the others. What the plan says, and who carries it out (λScale
§5, FaaScale §5):
- `cold_leader`: first bring the model into that node's host tier (`hooks.make_host_copy`:
  the controller owns the host cache); it is then a host source;
- `local`: each such destination loads the whole model from its own tier, then serves
  (`scaleout/local.py`); warm ones (their own host copy) of a system that serves while
  loading with pipelines load as `policy.warm_pipelines` groups, serving as a pipeline
  meanwhile (`scaleout/warm.py`, λScale §5);
- `sources` / `receivers`: one multicast, plan node i = `plan.multicast_nodes[i]`
  (`scaleout/multicast.py`), serving while loading as the system says.
Systems whose `load` is `registry-parallel` (ParaServe) fetch as pipeline groups instead
(`scaleout/paraserve.py`); FlexPipe's instances are live pipelines (`scaleout/flexpipe.py`).
No choice is made here: sources, leader and groups come from
`policy/`.
"""

import asyncio
import logging
from dataclasses import replace

from surge.policy.copies.mate_copies import plan_mate_opens
from surge.policy.startup import StartupPlan, StartupRequest, plan_startup
from surge.policy.warm_pipelines import plan_warm_groups
from surge.runtime.scaleout.context import ScaleOutContext
from surge.runtime.scaleout.flexpipe import run_flexpipe
from surge.runtime.scaleout.ilp_warmup import warm_solver
from surge.runtime.scaleout.local import load_then_serve, open_mate_then_serve
from surge.runtime.scaleout.multicast import run_multicast
from surge.runtime.scaleout.paraserve import run_groups
from surge.runtime.scaleout.warm import run_warm_group

log = logging.getLogger(__name__)


def startup_plan(ctx: ScaleOutContext) -> StartupPlan:
    return plan_startup(StartupRequest(ctx.system, ctx.destinations, ctx.copies))


async def _multicast(ctx: ScaleOutContext, plan: StartupPlan) -> None:
    """The multicast. While it runs, its GPU sources and chain tails are busy sending (a
    host copy is not an instance: its node's NIC is held, `host_sending`), and its
    receivers are chain tails a later start-up may forward from (BlitzScale §5.1 Alg. 1
    line 10; tests/parity/test_startup_parity.py)."""
    senders = tuple(s.node for s in plan.sources if s.tier in ("gpu", "loading"))
    hosts = tuple(s.node for s in plan.sources if s.tier == "host")
    ctx.hooks.sending(senders, 1)
    ctx.hooks.host_sending(hosts, 1)
    ctx.hooks.receiving(plan.receivers, True)
    try:
        await run_multicast(ctx, plan)
    finally:
        ctx.hooks.receiving(plan.receivers, False)
        ctx.hooks.host_sending(hosts, -1)
        ctx.hooks.sending(senders, -1)


async def run_scale_out(ctx: ScaleOutContext) -> str:
    """Bring the context's destinations up as local instances; returns the start kind."""
    warm_solver(ctx.system)  # a live look may come with the first block (ilp_warmup.py)
    opens = plan_mate_opens(ctx.nodes, ctx.links, ctx.device_owners)
    if not opens:
        return await _run_planned(ctx)
    ctx.report.mate_opens = opens
    opened = {o.node for o in opens}
    rest = tuple(d for d in ctx.destinations if d.node not in opened)
    tasks = [asyncio.ensure_future(open_mate_then_serve(ctx, o.node, o.mate)) for o in opens]
    if rest:  # the same report: what the rest does is written beside the opens
        tasks.append(asyncio.ensure_future(_run_planned(replace(ctx, destinations=rest))))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    ctx.report.kind = "hot"  # a device copy existed
    return "hot"


async def _run_planned(ctx: ScaleOutContext) -> str:
    """`run_scale_out` for the destinations `policy.startup` plans."""
    plan = startup_plan(ctx)
    ctx.report.kind = plan.kind
    if ctx.system.group_sizing == "flexpipe":
        await run_flexpipe(ctx, plan)
        return plan.kind
    if ctx.system.load == "registry-parallel":
        await run_groups(ctx, plan)
        return plan.kind
    leader = plan.cold_leader
    local = [x for x in plan.local if leader is None or x.node != leader.node]
    # λScale §5 warm start: warm-local destinations load in rotated orders and serve as
    # execution pipelines meanwhile (with serve-while-loading pipelines).
    groups = ()
    if ctx.serve_while_loading and ctx.system.serve_while_loading == "pipelines":
        warm = tuple(x.node for x in local if x.source == "host")
        groups = plan_warm_groups(warm, ctx.manifest.num_blocks)
    grouped = {n for g in groups for n in g.nodes}
    # Warm-local loads start at once; the leader's own load waits for its host copy.
    tasks = [
        asyncio.ensure_future(load_then_serve(ctx, x.node, x.source))
        for x in local
        if x.node not in grouped
    ]
    tasks += [asyncio.ensure_future(run_warm_group(ctx, g)) for g in groups]
    try:
        if leader is not None:
            await ctx.hooks.make_host_copy(leader.node)
            tasks.append(asyncio.ensure_future(load_then_serve(ctx, leader.node, "host")))
        if plan.receivers:
            ctx.report.sources = tuple(s.node for s in plan.sources)
            tasks.append(asyncio.ensure_future(_multicast(ctx, plan)))
    finally:
        results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return plan.kind
