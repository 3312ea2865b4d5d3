"""A destination loading from its own tier, or opening a host mate's device copy, and serving
alone.

What flows: a node id and where its blocks come from (its own `host`, `disk` or `remote`
tier, as `policy.startup` said; or a host mate's device copy, as `policy.copies.mate_copies`
said: an `OpenMateCopyOp`); a `LoadOp` into the gpu tier, then an instance
(`InstanceOpenOp` through `LocalEndpoint.open`), which the server routes to and the
controller hears about (`hooks.on_local`). Used by `run.py`, `multicast.py` (`GoLocal`) and
`paraserve.py` (parts and the rest). Under GPU-time emulation an instance whose weights are
in waits for the engine start its system's `init_s` says before it serves (`engine_start`).
"""

from surge.policy.startup import engine_start_wait_s
from surge.policy.systems import SystemConfig
from surge.runtime.clock import Clock
from surge.runtime.protocol import LoadOp, OpenMateCopyOp
from surge.runtime.scaleout.context import ScaleOutContext


async def engine_start(clock: Clock, system: SystemConfig, launch_s: float) -> None:
    """Wait, on `clock`, for the engine start of an instance launched at `launch_s` whose
    weights are in now: `system.init_s` after them, or beside their fetch
    (`init_overlaps_load`, ParaServe §5), as the simulator charges it
    (`policy.startup.engine_start_wait_s`). Only under emulation: on real hardware the
    engine's own start is real, and the emulated GPU's start is not the host's."""
    wait_s = engine_start_wait_s(system, launch_s, clock.now_s())
    if wait_s > 0:
        await clock.sleep(wait_s)


async def started(ctx: ScaleOutContext, launch_s: float) -> None:
    """`engine_start` for one of the scale-out's instances when its engine start is paced
    (`ctx.paced_setups`, set under emulation); else nothing."""
    if ctx.paced_setups:
        await engine_start(ctx.server.clock, ctx.system, launch_s)


async def load_blocks(ctx: ScaleOutContext, node: int, blocks: list[int], source: str) -> None:
    """Read `blocks` from the node's own `source` tier into its gpu tier; from the disk or
    the registry, through its host tier when the controller keeps that copy
    (ServerlessLLM's LRU cache, `ControllerSide.keep_host_copy`)."""
    keep = source in ("disk", "remote") and ctx.hooks.keep_host_copy(node)
    op = LoadOp(model=ctx.model, blocks=tuple(blocks), tier="gpu", source=source, keep_host=keep)  # type: ignore[arg-type]
    try:
        await ctx.client.call(node, op)
    finally:
        if keep:  # the admitted copy held its room while it arrived
            ctx.hooks.host_copy_done(node)


async def open_local(ctx: ScaleOutContext, node: int) -> None:
    """The node holds every block: open its instance, route to it, tell the controller."""
    ep = ctx.local_endpoint(node)
    await ep.open()
    await ctx.server.add_endpoint(ep)
    ctx.record_open(ep.name, ep.nodes)
    await ctx.hooks.on_local(node, ep)


async def load_then_serve(ctx: ScaleOutContext, node: int, source: str) -> None:
    """Load the whole model from the node's own tier, start the engine, then serve."""
    launch_s = ctx.server.clock.now_s()
    await load_blocks(ctx, node, list(range(ctx.manifest.num_blocks)), source)
    await started(ctx, launch_s)
    await open_local(ctx, node)


async def open_mate_then_serve(ctx: ScaleOutContext, node: int, mate: int) -> None:
    """Map host mate `mate`'s device copy of the whole model into the node's gpu tier (no
    copy on the same device), then serve."""
    blocks = tuple(range(ctx.manifest.num_blocks))
    await ctx.client.call(node, OpenMateCopyOp(model=ctx.model, blocks=blocks, mate=mate))
    await open_local(ctx, node)
