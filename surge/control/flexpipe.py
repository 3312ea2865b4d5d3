"""FlexPipe's granularity loop in the controller: arrivals' CV -> stage count -> live refactoring.

What flows (paper 003 §6): every autoscaler tick calls `tick` for each deployment whose
system's `group_sizing` is `flexpipe`; at most every `decision_interval_s` it takes the
arrivals of the last `cv_window_s` (the deployment's `Server` keeps them) to
`system.choose_num_stages` (Eq. 4, smoothed, with hysteresis; the state is the
deployment's `FlexPipeRecord`), capped by `system.split_stages` (the model's load
time from the best tier the free nodes hold, `policy.flexpipe.scaling_load`, against the
hops of the waiting requests' tokens). Each
serving `FlexPipeline` that `groups.group_refactors` names (split while requests
wait, merged to what holds its load while none does) is re-cut: `choose_stages` keeps its
first nodes and places new stages on free slots (Eq. 6), their slots are booked
(`Deployment.instances`, the pipeline as their endpoint), and
`runtime.migration.refactor.refactor_pipeline` splits or merges it in flight (K/V follows the
layers, Eq. 10). Slots the pipeline no longer uses are released afterwards; on a failure the booked
ones are. `surge_pipeline_refactors_total{model,direction}` counts refactorings and
`describe_flexpipe` is the deployment status' `flexpipe` entry (`surge status`). Slots of a
pipeline that failed or was retired (an agent died) are released here too, so the
autoscaler starts a new one. Each tick also sets every pipeline's `route_target`
(`groups.pipeline_target`): the `pack` router fills the busiest pipeline up to it,
so surplus pipelines go idle and the autoscaler releases them. Every decision is
`surge.policy.flexpipe.system`'s. Owned by control/.
"""

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from surge.control.copies import Copies
from surge.control.metrics import Metrics
from surge.control.pool import ParameterPool
from surge.control.scaleout_side import record_marks
from surge.control.scaleouts import own_tiers
from surge.control.state import Deployment, FlexPipeRecord, Instance
from surge.events import NO_BUS, EventBus, Refactor
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.flexpipe.granularity import cv_of_arrivals
from surge.policy.flexpipe.groups import (
    GroupView,
    group_refactors,
    pipeline_autoscale,
    pipeline_target,
)
from surge.policy.flexpipe.host_keep import stage_sources
from surge.policy.flexpipe.hrg import ScalingMark
from surge.policy.flexpipe.system import (
    arrivals_in_window,
    choose_num_stages,
    choose_stages,
    split_stages,
)
from surge.policy.multicast.topology import NodeLinks
from surge.runtime.client import ClusterClient
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.migration.refactor import FlexPipeline, Stages, refactor_pipeline
from surge.runtime.protocol import LoadOp
from surge.runtime.scaleout.estimates import HOST_ESTIMATES, ServingEstimates
from surge.runtime.scaleout.flexpipe import (
    free_slots,
    hrg_view,
    layer_profile,
    load_seconds,
    micro_batches,
    profile_stages,
    scaling_marks,
    waiting_decode_steps,
)

log = logging.getLogger(__name__)


def is_flexpipe(dep: Deployment) -> bool:
    return dep.spec.system.group_sizing == "flexpipe"


def flexpipe_autoscale(dep: Deployment, base: AutoscaleSettings) -> AutoscaleSettings:
    """The autoscaler's knobs for a FlexPipe deployment: a pipeline of η stages with m
    micro-batches in flight works on min(η, m) of them at once, so it takes that many
    instances' worth of requests (`groups.pipeline_autoscale`, given η in both bodies;
    m is `microbatch.flexpipe_micro_batches` in both, η bounded by the KV cache); other
    deployments keep `base`."""
    if not is_flexpipe(dep):
        return base
    busy = [
        e.num_stages
        for e in dep.server.endpoints.values()
        if isinstance(e, FlexPipeline) and not e.failed
    ]
    return pipeline_autoscale(base, sum(busy) / len(busy)) if busy else base


def describe_flexpipe(dep: Deployment) -> dict[str, Any] | None:
    """The status entry of a FlexPipe deployment (None for other strategies)."""
    if not is_flexpipe(dep):
        return None
    rec = dep.flexpipe or FlexPipeRecord()
    pipes = [e for e in dep.server.endpoints.values() if isinstance(e, FlexPipeline)]
    return {
        "cv": round(rec.cv, 3),
        "num_stages_wanted": rec.num_stages,
        "pipelines": [{"name": p.name, "stages": [list(s) for s in p.stages]} for p in pipes],
        "refactors": dict(rec.refactors),
        "failed_refactors": rec.failed_refactors,
    }


class FlexPipeControl:
    """The loop above, for every FlexPipe deployment (called by the autoscaler's tick)."""

    def __init__(
        self,
        client: ClusterClient,
        pool: ParameterPool,
        metrics: Metrics,
        copies: Copies,
        live_nodes: Callable[[], list[int]],
        free_slots_of: Callable[[int], int],
        link_gbps: float | None = None,
        events: EventBus = NO_BUS,
        clock: Clock = REAL_CLOCK,
        estimates: ServingEstimates = HOST_ESTIMATES,
        links: Mapping[int, NodeLinks] | None = None,
        scaling_marks: list[ScalingMark] | None = None,
    ) -> None:
        self.clock = clock
        self.links: Mapping[int, NodeLinks] = links if links is not None else {}
        """Each agent's reported links: its host group is its server in §7's HRG."""
        self.scaling_marks = scaling_marks if scaling_marks is not None else []
        """The cluster's HRG markers (the autoscaler's list: scale-outs add theirs)."""
        """The control plane's clock (refactorings are timed on it)."""
        self.estimates = estimates
        """Compute and fetch rates before the stages are profiled (`scaleout/estimates.py`)."""
        self.client, self.pool, self.metrics, self.copies = client, pool, metrics, copies
        self.events = events
        """The dashboard's stream: each completed refactoring (`Refactor`)."""
        self.live_nodes, self.free_slots_of = live_nodes, free_slots_of
        self.link_gbps = link_gbps or estimates.fetch_gbps

    async def tick(self, dep: Deployment, now_s: float) -> None:
        if not is_flexpipe(dep):
            return
        if dep.flexpipe is None:
            dep.flexpipe = FlexPipeRecord()
        rec = dep.flexpipe
        await self._reap(dep, rec)
        for e in list(dep.server.endpoints.values()):  # what the `pack` router fills each up to
            if isinstance(e, FlexPipeline):
                e.route_target = pipeline_target(dep.spec.autoscaling, e.num_stages)
                if not e.failed and not e.refactoring:
                    await e.settle_kv()  # head engines that drained give their KV back
        system = dep.spec.system
        settings = system.flexpipe
        if now_s - rec.last_decision_s < settings.decision_interval_s:
            return
        rec.last_decision_s = now_s
        pipes = [
            e for e in dep.server.endpoints.values() if isinstance(e, FlexPipeline) and not e.failed
        ]
        profile = layer_profile(dep.manifest, system, pipes[0] if pipes else None, self.estimates)
        arrivals = arrivals_in_window(tuple(dep.server.arrivals), now_s, settings)
        rec.cv = cv_of_arrivals(arrivals)
        eq4, rec.state = choose_num_stages(arrivals, profile, rec.state, settings)
        queue = dep.server.queue
        free_now = [  # the nodes a split's new stages may load on (§7 Eq. 12's S_j)
            n
            for n in self.live_nodes()
            if n not in dep.instances and n not in rec.booked and self.free_slots_of(n) > 0
        ]
        tiers = [d.own_tier for d in own_tiers(self.pool, dep.name, free_now)]
        load_s = load_seconds(dep.manifest, tiers, self.estimates.tier_rates(self.link_gbps))
        rec.num_stages = split_stages(eq4, load_s, profile, waiting_decode_steps(queue), settings)
        views = [
            GroupView(i, len(p.stages), p.outstanding, p.refactoring) for i, p in enumerate(pipes)
        ]
        base = dep.spec.autoscaling
        for cut in group_refactors(views, rec.num_stages, len(queue), base, settings):
            pipe = pipes[cut.group_id]
            kept = [n for n, _, _ in pipe.stages]
            free = [
                n
                for n in self.live_nodes()
                if n not in dep.instances and n not in rec.booked and self.free_slots_of(n) > 0
            ]
            choice = choose_stages(
                profile,
                cut.num_stages,
                kept,
                free_slots(free, dep.manifest),
                rec.cv,
                self.link_gbps,
                2 * dep.manifest.total_bytes,
                settings,
                hrg=hrg_view([*kept, *free], self.links, now_s, tuple(self.scaling_marks)),
            )
            if choice is None:
                continue
            target = [(n, a, b) for n, (a, b) in zip(choice.slots, choice.bounds, strict=True)]
            if target == list(pipe.stages):
                continue  # no free slot for a finer cut now
            new = [n for n in choice.slots if n not in kept]
            record_marks(self.scaling_marks, scaling_marks(new, self.links, now_s))
            for n in new:
                dep.instances[n] = Instance(n, endpoint=pipe)  # type: ignore[arg-type]
                rec.booked.add(n)
            micro, _ = micro_batches(system, dep.manifest, pipe.config, len(target))
            pipe.refactoring = True  # until the task below runs it (no second one meanwhile)
            dep.spawn(self._refactor(dep, rec, pipe, target, new, micro))

    async def _refactor(
        self,
        dep: Deployment,
        rec: FlexPipeRecord,
        pipe: FlexPipeline,
        target: Stages,
        new: list[int],
        micro: int,
    ) -> None:
        before = [n for n, _, _ in pipe.stages]

        async def load(node: int, blocks: list[int]) -> None:
            held = self.pool.blocks_at(dep.name, node, "gpu")
            missing = tuple(b for b in blocks if b not in held)
            # FlexPipe §7: the blocks it kept in its host tier load from there
            own = own_tiers(self.pool, dep.name, [node])[0].own_tier
            kept = self.pool.blocks_at(dep.name, node, "host")
            ops = [
                LoadOp(dep.name, part, tier="gpu", source=src)  # type: ignore[arg-type]
                for src, part in stage_sources(own, kept, missing)
            ]
            await asyncio.gather(*(self.client.call(node, op) for op in ops))

        def alive() -> bool:
            return dep.server.endpoints.get(pipe.name) is pipe

        pipe.refactoring = False  # refactor_pipeline takes it from here
        try:
            result = await refactor_pipeline(
                pipe,
                target,
                load,
                alive,
                micro,
                self.clock,
                batch_retired=dep.spec.system.flexpipe.batch_merged_sequences,
            )
        except Exception as e:
            log.warning("%s: refactoring %s to %s failed: %s", dep.name, pipe.name, target, e)
            rec.failed_refactors += 1
            leaving = new
        else:
            rec.refactors[result.direction] = rec.refactors.get(result.direction, 0) + 1
            self.metrics.refactors.labels(dep.name, result.direction).inc()
            stages = tuple((n, a, b) for n, a, b in pipe.stages)
            self.events.publish(Refactor(model=dep.name, name=pipe.name, stages=stages))
            leaving = [n for n in before if n not in pipe.nodes]
            try:
                await profile_stages(pipe)
            except Exception as e:  # the last profile stays in use
                log.info("%s: profiling after the refactoring failed: %s", pipe.name, e)
        finally:
            rec.booked.difference_update(new)
        for n in leaving:
            inst = dep.instances.get(n)
            if inst is not None and inst.endpoint is pipe:
                dep.instances.pop(n, None)
                await self.copies.release_slot(dep.name, n, dep.manifest.num_blocks)

    async def _reap(self, dep: Deployment, rec: FlexPipeRecord) -> None:
        """Release the slots of pipelines that no longer serve, and of nodes a pipeline
        left (outside a refactoring, which releases its own)."""
        for node, inst in list(dep.instances.items()):
            ep = inst.endpoint
            if not isinstance(ep, FlexPipeline) or node in rec.booked:
                continue
            serving = dep.server.endpoints.get(ep.name) is ep and not ep.failed
            if serving and (node in ep.nodes or ep.refactoring):
                continue
            dep.instances.pop(node, None)
            await self.copies.release_slot(dep.name, node, dep.manifest.num_blocks)
