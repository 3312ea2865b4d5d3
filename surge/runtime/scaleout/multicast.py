"""One multicast of a scale-out, serving while the model arrives (λScale §4.3-§4.4).

In: the context and the start-up plan (plan node i = `plan.multicast_nodes[i]`, sources
first). The multicast plan comes from `policy.multicast.scale_out.plan_scale_out` with the system's
`multicast_strategy`, on the `Cluster` `policy.multicast.topology.multicast_cluster` makes of the
agents' reported links and host groups and of what each source's egress carries;
the agents run it through `runtime/multicast.py`'s executor. Every
verified gpu-tier arrival of this multicast (`BlockArrived`, filtered by model) is fed to
`policy.loading.LoadingState`, and the actions it returns are carried out in order:
- `OpenPipeline`: open the planned execution pipeline as a `PipelineEndpoint`;
- `GoLive`: the node joins BlitzScale live scaling (`scaleout/live.py`);
- `GoLocal`: the node holds every block: open its local instance;
- `RetirePipeline`: retire the pipeline; its requests are spread evenly over its members'
  local instances (λScale §4.4 mode switch, `policy.loading.spread_evenly`).
With `serve_while_loading` off (another multicast of the model still serves), the state
machine runs in mode `none`: receivers serve only once whole. A system with a `gloo` or
`gloo-ring` `multicast_transport` (the NCCL baseline) moves the bytes in a real gloo group
(`runtime/collective.py`), whose creation is its set-up cost (under emulation at least the
system's `group_setup_s`, `group_setup_floor_s`); one with a `group_setup_s`
and the `blocks` transport waits that long on the serving clock before the first block
moves (a communicator's creation, modelled). Out: endpoints opened and
retired, recorded on the context. The state machine is the same one the simulator feeds.
"""

import asyncio
import logging

from surge.events import ModeSwitch, PipelineRetired
from surge.policy.loading import (
    GoLive,
    GoLocal,
    LoadingAction,
    LoadingSettings,
    LoadingState,
    OpenPipeline,
    RetirePipeline,
)
from surge.policy.multicast.group_block_bound import group_link
from surge.policy.multicast.scale_out import MulticastOutcome, MulticastRequest, plan_scale_out
from surge.policy.multicast.topology import NodeLinks, NodeTraffic, multicast_cluster
from surge.policy.startup import StartupPlan
from surge.runtime.collective import GroupExecutor
from surge.runtime.multicast import MulticastExecutor
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.protocol import BlockArrived
from surge.runtime.scaleout.context import (
    ScaleOutContext,
    instance_name,
    pipeline_name,
    stage_layers,
)
from surge.runtime.scaleout.live import LiveScaling
from surge.runtime.scaleout.local import open_local

log = logging.getLogger(__name__)


def plan_multicast(ctx: ScaleOutContext, agents: list[int], num_sources: int) -> MulticastOutcome:
    """The plan of a multicast among `agents` (plan node i = agents[i], sources first), on
    the cluster `policy.multicast.topology` makes of what the agents reported (link caps, host
    groups) and what each source's egress carries now (busy P/D prefill sources are
    pruned by BlitzScale's chains, Alg. 1 Line 2)."""
    b = ctx.manifest.num_blocks
    traffic = ctx.hooks.traffic()
    cluster = multicast_cluster(
        num_sources,
        [ctx.links.get(a, NodeLinks()) for a in agents],
        [traffic.get(a, NodeTraffic()) for a in agents],
    )
    return plan_scale_out(
        MulticastRequest(
            num_nodes=len(agents),
            num_blocks=b,
            num_sources=num_sources,
            strategy=ctx.system.multicast_strategy,
            cluster=cluster,
            block_bytes=max(1, ctx.manifest.total_bytes // b),
        )
    )


class LoadingCarrier:
    """Carries out the loading state machine's actions for one multicast (or one warm
    group, `scaleout/warm.py`)."""

    def __init__(
        self,
        ctx: ScaleOutContext,
        agents: list[int],
        mc_id: str,
        live: LiveScaling | None,
    ) -> None:
        self.ctx, self.agents, self.mc_id = ctx, agents, mc_id
        self.live = live
        self.names: dict[int, str] = {}
        """Open pipelines: plan index -> endpoint name."""

    async def carry_out(self, action: LoadingAction) -> None:
        ctx = self.ctx
        if isinstance(action, OpenPipeline):
            name = pipeline_name(ctx.model, self.mc_id, action.index)
            stages = stage_layers(ctx.manifest, action.pipeline, self.agents)
            ep = PipelineEndpoint(ctx.client, ctx.manifest, ctx.model, name, stages, ctx.engine)
            t0 = ctx.server.clock.now_s()
            await ep.open()
            await ctx.server.add_endpoint(ep)
            self.names[action.index] = name
            ctx.record_open(name, ep.nodes, stages)
            log.info("opened %s on %s in %.3f s", name, ep.nodes, ctx.server.clock.now_s() - t0)
        elif isinstance(action, GoLive):
            if self.live is not None:
                self.live.go_live(self.agents[action.node])
                ctx.events.publish(
                    ModeSwitch(model=ctx.model, node=self.agents[action.node], mode="live")
                )
        elif isinstance(action, GoLocal):
            node = self.agents[action.node]
            ctx.events.publish(ModeSwitch(model=ctx.model, node=node, mode="local"))
            if self.live is not None:
                self.live.go_local(node)
            await open_local(ctx, node)
            if self.live is not None:  # §5.2 step 3: queued requests spread onto it
                await self.live.redistribute(node)
                self.live.opened()
        elif isinstance(action, RetirePipeline):
            members = tuple(instance_name(ctx.model, self.agents[v]) for v in action.pipeline.nodes)
            await self.retire(action.index, members)

    async def retire(self, index: int, spread_over: tuple[str, ...] = ()) -> None:
        """Retire open pipeline `index`: its requests spread over the local instances in
        `spread_over` (a mode switch), or, with none (a member died), go back to the queue."""
        name = self.names.pop(index, None)
        if name is None:
            return
        moved = await self.ctx.server.retire(name, spread_over)
        self.ctx.report.retired.append((name, self.ctx.server.clock.now_s(), len(moved)))
        self.ctx.events.publish(
            PipelineRetired(model=self.ctx.model, name=name, num_moved=len(moved))
        )
        log.info("retired %s (%d moved)", name, len(moved))


def group_setup_floor_s(ctx: ScaleOutContext) -> float:
    """Real seconds a gloo group's creation lasts at least: under GPU-time emulation
    (`ctx.paced_setups`) the system's `group_setup_s` on the serving clock, the emulated
    NCCL communicator's creation the simulator charges (`policy.systems.NCCL_GROUP_SETUP_S`):
    a CPU group on one host forms in a few emulated ms. Else 0: the group takes what it
    takes."""
    return ctx.server.clock.real_s(ctx.system.group_setup_s) if ctx.paced_setups else 0.0


async def run_multicast(ctx: ScaleOutContext, plan: StartupPlan) -> None:
    """Multicast to `plan.receivers` into the gpu tier, serving while it loads."""
    if ctx.system.waited_setup_s > 0:
        # NCCL-style broadcast: a communicator among these agents first (BlitzScale §5:
        # ~100 ms; λScale §7.2: "up to hundreds of milliseconds"), on the serving clock,
        # before it plans, as the simulator's loader waits it (`sim/loading.py`)
        await ctx.server.clock.sleep(ctx.system.waited_setup_s)
    agents = list(plan.multicast_nodes)
    k, b = len(plan.sources), ctx.manifest.num_blocks
    outcome = plan_multicast(ctx, agents, k)
    mode = ctx.system.serve_while_loading if ctx.serve_while_loading else "none"
    state = LoadingState(
        LoadingSettings(
            num_nodes=len(agents),
            num_blocks=b,
            num_sources=k,
            pipelines=tuple(outcome.pipelines),
            mode=mode,
            live_start_fraction=ctx.system.live_start_fraction,
        )
    )
    transport = ctx.system.multicast_transport
    where = (ctx.client, ctx.model, outcome.plan, agents)
    if transport == "blocks":
        executor = MulticastExecutor(
            *where, tier="gpu", pipelines=outcome.pipelines, timeout_s=ctx.timeout_s
        )
    else:  # the NCCL baseline: a real gloo group moves the bytes
        executor = GroupExecutor(
            *where,
            tier="gpu",
            pipelines=outcome.pipelines,
            timeout_s=ctx.timeout_s,
            algorithm="ring" if transport == "gloo-ring" else "broadcast",
            setup_floor_s=group_setup_floor_s(ctx),
            link=group_link(
                [ctx.links.get(a, NodeLinks()) for a in [agents[0], *agents[k:]]],
                max(b.size_bytes for b in ctx.manifest.blocks),
            ),
            block_bound=ctx.group_block_bound,
        )
    plan_node = {a: i for i, a in enumerate(agents)}
    # Receivers that forward within the plan hold their egress too: a later start-up
    # ranks such a chain tail after a free one (tests/parity/test_startup_parity.py).
    steps = outcome.plan.steps
    forwarders = tuple(sorted({agents[t.src] for st in steps for t in st if t.src >= k}))
    live = None
    if mode == "live":  # receivers only: the sources already serve
        live = LiveScaling(ctx, {a: state.held[v] for a, v in plan_node.items() if v >= k})
    carrier = LoadingCarrier(ctx, agents, executor.mc_id, live)
    events = ctx.client.subscribe((BlockArrived,), model=ctx.model)
    task = asyncio.get_running_loop().create_task(executor.run())
    live_task = live.start() if live is not None else None
    ctx.hooks.sending(forwarders, 1)
    try:
        while not (task.done() and events.empty()):
            try:
                async with asyncio.timeout(0.2):
                    ev = await events.get()
            except TimeoutError:
                continue
            if not isinstance(ev, BlockArrived) or ev.mc_id != executor.mc_id:
                continue
            if ev.tier != "gpu" or ev.node not in plan_node:
                continue
            if live is not None:  # its layer load time (Eq. 1's Time_l)
                live.arrived(ev.node, ev.block, ev.t)
            for action in state.arrive(plan_node[ev.node], ev.block):
                await carrier.carry_out(action)
        ctx.report.multicast = task.result()
    finally:
        ctx.hooks.sending(forwarders, -1)
        ctx.client.unsubscribe(events)
        if not task.done():
            task.cancel()
        if live is not None and live_task is not None:
            await live.stop(live_task)
        # A member died before completing: its pipelines retire, their requests move on.
        for index in list(carrier.names):
            await carrier.retire(index)
