"""FlexPipe scale-out: each new instance is a live pipeline whose shape can change (paper 003).

In: the context (destinations, spare nodes with a free slot and their own tiers, the
system, the server's arrivals). For each destination, one `FlexPipeline`:
- the stage count of a new instance (§7 Eq. 11/12, `system.scale_out_num_stages`:
  the arrivals' CV over the last `cv_window_s` times the queue length, fine enough that
  the queue is served within the TTFT SLO when the model loads split over the stages from
  the best tier the destination and spares hold, `load_seconds`; never coarser than Eq.
  4's choice); the controller's granularity loop,
  `control/flexpipe.py`, owns the shape from then on;
- layers (§5 Eq. 2) and nodes by `system.choose_stages`: the destination runs
  the first stage, spares (booked with `hooks.book`) the others, placed by
  `place_new_group` (§7 Eq. 13 affinity, the nodes that hosted the model most recently
  first, `hosted_s`: served it or hold a host copy; then §6.2 Eq. 6);
- the members load their stages' blocks from their own tier in parallel (§7: new
  fine-grained stages load from host copies in parallel), the pipeline opens and serves,
  every member's slot records it (`hooks.on_local`); its head keeps η micro-batches in
  flight for η stages, bounded by the KV cache (§7 Eq. 12, `micro_batches`);
- then each stage is profiled on its node (`stage_profile`: per-layer prefill and decode
  times, activation bytes), which the partition DP uses from then on (`layer_profile`).
Before a model has been profiled, `layer_profile` estimates, documented in
docs/flexpipe.md (`scaleout/estimates.py`: the emulated GPU's under emulation): a decode step
reads the weights once at `weight_read_bytes_per_s`, a prefill of `PROFILE_TOKENS` costs
`prefill_over_decode` decodes.
"""

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence

from surge.config import EngineConfig
from surge.model.manifest import Manifest
from surge.policy.flexpipe.granularity import cv_of_arrivals
from surge.policy.flexpipe.host_keep import stage_sources
from surge.policy.flexpipe.hrg import HrgView, ScalingMark
from surge.policy.flexpipe.microbatch import flexpipe_micro_batches
from surge.policy.flexpipe.scaling_load import TierRates, new_group_load_s
from surge.policy.flexpipe.slot_allocation import HostingRecord, SlotState
from surge.policy.flexpipe.stage_placement import Affinity
from surge.policy.flexpipe.system import (
    LayerProfile,
    StageChoice,
    arrivals_in_window,
    choose_stages,
    scale_out_num_stages,
)
from surge.policy.multicast.topology import NodeLinks, server_of_nodes
from surge.policy.startup import StartupPlan
from surge.policy.systems import SystemConfig
from surge.runtime.migration.refactor import FlexPipeline, blocks_of_stage
from surge.runtime.protocol import StageProfileOp
from surge.runtime.request import ServeRequest
from surge.runtime.scaleout.context import ScaleOutContext, flexpipe_name
from surge.runtime.scaleout.estimates import HOST_ESTIMATES, ServingEstimates
from surge.runtime.scaleout.local import load_blocks, started

log = logging.getLogger(__name__)

PROFILE_TOKENS = 32
"""Prompt tokens of a profiling prefill (and of the activation the partition charges)."""


def layer_profile(
    manifest: Manifest,
    system: SystemConfig,
    pipe: FlexPipeline | None,
    estimates: ServingEstimates = HOST_ESTIMATES,
) -> LayerProfile:
    """The model's layer profile: measured on the nodes once `pipe` has been profiled
    (every layer), else the estimates of the module docstring (`estimates`)."""
    n = manifest.arch.num_layers
    param_bytes = max(1, manifest.total_bytes // n)
    measured = pipe.layer_times if pipe is not None else {}
    if len(measured) == n:
        prefill = tuple(measured[i][0] for i in range(n))
        decode = [measured[i][1] for i in range(n)]
        return LayerProfile(
            num_layers=n,
            prefill_s=sum(prefill) / n,
            decode_s=sum(decode) / n,
            param_bytes=param_bytes,
            activation_bytes=pipe.activation_bytes_per_token * PROFILE_TOKENS,  # type: ignore[union-attr]
            hop_s=system.stage_hop_s,
            layer_prefill_s=prefill,
        )
    decode_s = estimates.decode_s(manifest.total_bytes) / n
    return LayerProfile(
        num_layers=n,
        prefill_s=estimates.prefill_over_decode * decode_s,
        decode_s=decode_s,
        param_bytes=param_bytes,
        activation_bytes=manifest.arch.hidden_size * 4 * PROFILE_TOKENS,
        hop_s=system.stage_hop_s,
    )


def load_seconds(manifest: Manifest, candidate_tiers: Iterable[str], rates: TierRates) -> float:
    """§7 Eq. 12's S_j: the whole model from the best tier `candidate_tiers` hold (the
    nodes a new group or a split may use; a stage of m loads 1/m of it),
    `policy.flexpipe.scaling_load.new_group_load_s`."""
    return new_group_load_s(manifest.total_bytes, candidate_tiers, rates)


def waiting_decode_steps(queue: Sequence[ServeRequest]) -> float | None:
    """The waiting requests' mean `max_tokens` (None when none waits)."""
    return sum(r.params.max_tokens for r in queue) / len(queue) if queue else None


def micro_batches(
    system: SystemConfig, manifest: Manifest, engine: EngineConfig, num_stages: int
) -> tuple[int, int]:
    """The head's micro-batches for `num_stages` stages and the most for any granularity
    (§7 Eq. 12, `microbatch.flexpipe_micro_batches`, bounded by the KV cache)."""
    return flexpipe_micro_batches(
        system.flexpipe, num_stages, manifest.arch.num_layers, engine.max_kv_tokens
    )


def free_slots(nodes: list[int], manifest: Manifest) -> list[SlotState]:
    """Each node as a slot that can take any stage (one instance slot per node)."""
    return [SlotState(n, 2 * manifest.total_bytes) for n in nodes]


async def profile_stages(pipe: FlexPipeline) -> None:
    """Time every layer on the node that runs it (§5's t_c and s_a, measured)."""
    for node, _, _ in list(pipe.stages):
        op = StageProfileOp(pipeline=pipe.stage_key, num_tokens=PROFILE_TOKENS)
        reply = await pipe.client.call(node, op)
        for i, (p, d) in enumerate(zip(reply.prefill_s, reply.decode_s, strict=True)):
            pipe.layer_times[reply.first_layer + i] = (p, d)
        pipe.activation_bytes_per_token = reply.activation_bytes_per_token


def hrg_view(
    nodes: Sequence[int],
    links: Mapping[int, NodeLinks],
    now_s: float,
    marks: tuple[ScalingMark, ...] = (),
) -> HrgView:
    """What FlexPipe §7's HRG sees of `nodes`: each node's server is its host group (the
    nodes that share a machine and its fast link), else the node alone; `marks`: the
    cluster's recent scaling events."""
    servers = server_of_nodes(links)
    return HrgView({n: servers.get(n, n) for n in nodes}, marks=marks, now_s=now_s)


def scaling_marks(
    nodes: Sequence[int], links: Mapping[int, NodeLinks], now_s: float
) -> tuple[ScalingMark, ...]:
    """§7's HRG markers for a group just placed on `nodes`: their servers, now."""
    servers = server_of_nodes(links)
    return tuple(ScalingMark(s, now_s) for s in sorted({servers.get(n, n) for n in nodes}))


def choose_pipeline(ctx: ScaleOutContext, dest: int, spares: list[int]) -> StageChoice:
    profile = layer_profile(ctx.manifest, ctx.system, None, ctx.estimates)
    settings = ctx.system.flexpipe
    arrivals = arrivals_in_window(tuple(ctx.server.arrivals), ctx.server.clock.now_s(), settings)
    eta = scale_out_num_stages(
        arrivals,
        len(ctx.server.queue),
        profile,
        ctx.ttft_slo_s,
        load_seconds(
            ctx.manifest,
            [d.own_tier for d in (*ctx.destinations, *ctx.spares) if d.node in (dest, *spares)],
            ctx.estimates.tier_rates(ctx.fetch_gbps),
        ),
        settings,
        waiting_decode_steps(ctx.server.queue),
    )
    machine = {  # Eq. 13 scores servers: a node's machine (its own when None)
        d.node: d.node if d.machine is None else d.machine for d in (*ctx.destinations, *ctx.spares)
    }
    history = tuple(HostingRecord(machine.get(n, n), t) for n, t in sorted(ctx.hosted_s.items()))
    choice = choose_stages(
        profile,
        eta,
        (dest,),
        free_slots(spares, ctx.manifest),
        cv_of_arrivals(arrivals),
        ctx.fetch_gbps,
        2 * ctx.manifest.total_bytes,
        settings,
        Affinity(history, {n: machine.get(n, n) for n in spares}, ctx.server.clock.now_s()),
        hrg_view([dest, *spares], ctx.links, ctx.server.clock.now_s(), ctx.hooks.scaling_marks()),
    )
    assert choice is not None  # one stage on the destination always fits
    return choice


async def run_flexpipe(ctx: ScaleOutContext, plan: StartupPlan) -> None:
    """Every destination's instance comes up as a FlexPipe pipeline (module docstring)."""
    tiers = {d.node: d.own_tier for d in (*ctx.destinations, *ctx.spares)}
    for local in plan.local:
        tiers[local.node] = local.source
    spares = [d.node for d in ctx.spares]
    results = []
    for dest in ctx.destinations:
        choice = choose_pipeline(ctx, dest.node, spares)
        members = list(choice.slots)
        ctx.hooks.mark_scaling(scaling_marks(members, ctx.links, ctx.server.clock.now_s()))
        booked = [m for m in members[1:] if ctx.hooks.book(m)]
        if len(booked) < len(members) - 1:  # a spare was taken meanwhile: one stage
            for m in booked:
                await ctx.hooks.release(m)
            choice = StageChoice(((0, ctx.manifest.arch.num_layers),), (dest.node,))
            members = [dest.node]
        spares = [s for s in spares if s not in members]
        results.append(await _open_pipeline(ctx, choice, tiers))
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]


async def _open_pipeline(
    ctx: ScaleOutContext, choice: StageChoice, tiers: dict[int, str]
) -> BaseException | None:
    stages = [(n, a, b) for n, (a, b) in zip(choice.slots, choice.bounds, strict=True)]

    async def load(n: int, blocks: list[int]) -> None:
        # FlexPipe §7: the blocks the node kept in host memory load from there
        held = ctx.host_blocks.get(n, frozenset())
        parts = stage_sources(tiers.get(n, "remote"), held, blocks)
        await asyncio.gather(*(load_blocks(ctx, n, list(b), src) for src, b in parts))

    launch_s = ctx.server.clock.now_s()
    try:
        await asyncio.gather(*(load(n, blocks_of_stage(ctx.manifest, a, b)) for n, a, b in stages))
        await started(ctx, launch_s)
        name = flexpipe_name(ctx.model)
        micro, most = micro_batches(ctx.system, ctx.manifest, ctx.engine, len(stages))
        pipe = FlexPipeline(
            ctx.client, ctx.manifest, ctx.model, name, stages, ctx.engine, micro, most
        )
        await pipe.open()
    except BaseException as e:
        for m in choice.slots:
            await ctx.hooks.release(m)
        return e
    await ctx.server.add_endpoint(pipe)
    ctx.record_open(name, pipe.nodes)
    for m in choice.slots:
        await ctx.hooks.on_local(m, pipe)  # type: ignore[arg-type]
    log.info("%s: flexpipe %s opened with stages %s", ctx.model, name, stages)
    try:
        await profile_stages(pipe)
    except Exception as e:  # estimates stay in use
        log.warning("%s: profiling %s failed: %s", ctx.model, name, e)
    return None
