"""A restarted controller adopts the instances the old one left on live agents.

What flows: at `start`, before the stores' versions are registered on the agents (an agent
refuses another version of a model while an instance of it runs: `policy.versions`), each
agent's `status` (what it holds and runs, `StatusReply.running`, each model's manifest
digest) and the restored deployments go to `policy.adoption.plan`; its actions are carried
out here: closes (`instance_close`, `stage_close`), releases (`Copies.release_slot`: the
instance closed, the device copy evicted, host and disk copies kept), drops (`drop_model`;
the store's version is registered after), one log line each with the policy's reason. An
adopted instance becomes its deployment's `Instance` again: the old controller's requests
still on it are aborted (their clients went with the old controller's connections), its
`LocalEndpoint` is routed to, with no load op and no weights moved. An adopted pipeline
(`policy.adoption.AdoptPipeline`: λScale's execution pipeline, a ParaServe group, a FlexPipe
pipeline) becomes the endpoint a scale-out would have opened over the stages already open on
the agents (new head engines, no `stage_open`): a `PipelineEndpoint`, or a `FlexPipeline`
(its stage key's version kept, its layers profiled again), the instance of each member node;
the old head engines' sequences are freed along its chain first (`stage_free`). Once the autoscaler
state is restored (`autoscale_memory.py`), `settle` gives each adopted instance the idle
time the state carries for its node (`policy.adoption.adopted_idle_since_s`), so its
keep-alive and downscale delay run from its own last request, not from the restart.
Decides nothing. Owned by control/.
"""

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from surge.config import EngineConfig
from surge.control.copies import Copies
from surge.control.spec import DeploymentSpec
from surge.control.state import Deployment, Instance
from surge.model.manifest import Manifest
from surge.policy.adoption import (
    Action,
    Adopt,
    AdoptPipeline,
    Close,
    Drop,
    HeldModel,
    NodeReport,
    Release,
    Restored,
    Running,
    adopted_idle_since_s,
    plan,
)
from surge.runtime.client import ClusterClient
from surge.runtime.clock import Clock
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.refactor import FlexPipeline, parse_stage_key
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.protocol import (
    DropModelOp,
    InstanceAbortOp,
    InstanceCloseOp,
    RunningHolding,
    StageCloseOp,
    StageFreeOp,
    StatusReply,
)
from surge.runtime.scaleout.context import instance_name
from surge.runtime.scaleout.flexpipe import micro_batches, profile_stages

log = logging.getLogger(__name__)


def node_report(node: int, status: StatusReply) -> NodeReport:
    """One agent's `status` as `policy.adoption` reads it."""
    return NodeReport(
        node,
        {m: HeldModel(h.digest, frozenset(h.gpu)) for m, h in status.models.items()},
        tuple(_running(r) for r in status.running),
    )


def _running(r: RunningHolding) -> Running:
    span = (r.first_layer, r.end_layer, r.next_node, r.compute_group, r.seq_ids)
    return Running(r.name, r.model, r.kind, r.req_ids, *span)


def restored(spec: DeploymentSpec, manifest: Manifest, nodes: list[int]) -> Restored:
    """A deployment being restored, as `policy.adoption` reads it."""
    cap = spec.autoscaling.max_replicas
    return Restored(
        manifest.digest,
        manifest.num_blocks,
        {n: instance_name(spec.name, n) for n in nodes},
        len(nodes) if cap is None else min(cap, len(nodes)),
        tuple((b.first_layer, b.end_layer) for b in manifest.blocks),
    )


class Adopter:
    """Carries out `policy.adoption`'s plan for a restarted controller."""

    def __init__(
        self,
        client: ClusterClient,
        copies: Copies,
        slots_per_node: int,
        engine: EngineConfig,
        clock: Clock,
        attach_pd: Callable[[Deployment], Any],
    ) -> None:
        self.client, self.copies, self.clock = client, copies, clock
        self.slots_per_node = slots_per_node
        self.engine = engine
        """The controller's engine config: a local instance takes `max_num_seqs` requests
        at once; an adopted pipeline's head engines are built with it, as a scale-out's."""
        self.attach_pd = attach_pd
        """Gives a P/D deployment its `PdServing` before its first instance (an adopted
        instance gets its role as a new one does, `control/pd.py`)."""
        self._statuses: dict[int, StatusReply] = {}
        """The agents' answers the last plan read."""
        self.adopted: list[tuple[str, int]] = []
        """(deployment, node) of the instances adopted at this start, before `settle`."""
        self.settled = False
        """`settle` has run (the autoscaler state is restored)."""

    def plan(
        self,
        statuses: Mapping[int, StatusReply],
        deployments: Mapping[str, tuple[DeploymentSpec, Manifest]],
    ) -> tuple[Action, ...]:
        """What to adopt and close of what the agents report (`policy.adoption.plan`)."""
        self._statuses = dict(statuses)
        nodes = sorted(statuses)
        reports = tuple(node_report(n, s) for n, s in sorted(statuses.items()))
        wanted = {name: restored(spec, m, nodes) for name, (spec, m) in deployments.items()}
        return plan(reports, wanted, self.slots_per_node)

    async def clean(self, actions: tuple[Action, ...], manifests: Mapping[str, Manifest]) -> None:
        """Close, release and drop what the plan says (each with one log line); the
        stores' versions are registered after (`Deployments.restore_all`)."""
        for a in actions:
            if isinstance(a, Adopt | AdoptPipeline):
                continue
            if isinstance(a, Close):
                what = f"closing {a.name}"
            elif isinstance(a, Release):
                what = f"releasing {a.model}'s device copy"
            else:
                what = f"dropping {a.model} (every copy)"
            log.warning("restart: %s on node %d: %s", what, a.node, a.reason)
            try:
                await self._clean(a, manifests)
            except Exception as e:  # a node gone meanwhile: the healer deals with it
                log.warning("restart: %s on node %d failed: %s", what, a.node, e)

    async def _clean(self, a: Action, manifests: Mapping[str, Manifest]) -> None:
        if isinstance(a, Close) and a.kind == "stage":
            await self.client.call(a.node, StageCloseOp(pipeline=a.name))
        elif isinstance(a, Close):
            await self.client.call(a.node, InstanceCloseOp(instance=a.name))
        elif isinstance(a, Release):
            m = manifests.get(a.model)
            held = self._statuses[a.node].models.get(a.model)
            last = max(held.gpu, default=-1) if held is not None else -1
            await self.copies.release_slot(a.model, a.node, m.num_blocks if m else last + 1)
        elif isinstance(a, Drop):  # the store's version is registered next (`restore_all`)
            await self.client.call_bytes(a.node, DropModelOp(model=a.model))

    async def adopt(self, dep: Deployment, actions: tuple[Action, ...]) -> None:
        """Make the plan's adopted instances of `dep` its instances again: the old
        controller's requests on each aborted, then routed to (no load)."""
        self.attach_pd(dep)
        now_s = self.clock.now_s()
        for a in actions:
            if a.model != dep.name:
                continue
            if isinstance(a, AdoptPipeline):
                # Its members' slots now, loading until its head engines are up: off the
                # start's path (its old sequences are freed first; the API and the other
                # deployments do not wait for it), as a scale-out's instance loads
                for n in a.nodes:
                    dep.instances[n] = Instance(n)
                dep.spawn(self._adopt_pipeline(dep, a))
                continue
            if not isinstance(a, Adopt):
                continue
            try:
                await self._adopt(dep, a, now_s)
            except Exception as e:  # its node went down meanwhile: the autoscaler starts one
                dep.instances.pop(a.node, None)
                log.warning("restart: %s on node %d not adopted: %s", a.instance, a.node, e)

    async def _adopt(self, dep: Deployment, a: Adopt, now_s: float) -> None:
        if a.req_ids:  # lost with the old controller's connections: free their slots
            await self.client.call(a.node, InstanceAbortOp(a.instance, a.req_ids))
        ep = LocalEndpoint(self.client, a.node, dep.name, a.instance, self.engine.max_num_seqs)
        dep.instances[a.node] = Instance(a.node, endpoint=ep, idle_since_s=now_s)
        dep.host_last_used_s[a.node] = now_s
        await dep.server.add_endpoint(ep)
        self.adopted.append((dep.name, a.node))
        log.info(
            "restart: adopted %s on node %d with no load (%d of the old controller's "
            "requests aborted)", a.instance, a.node, len(a.req_ids),
        )  # fmt: skip

    async def _adopt_pipeline(self, dep: Deployment, a: AdoptPipeline) -> None:
        """One serving instance over the pipeline's stages (the shape a scale-out opens:
        `scaleout/multicast.py`, `scaleout/paraserve.py`), its members' slots its own; idle
        since the carried quiet time of each member's node, as an adopted local instance."""
        try:
            if a.seq_ids:  # the old head engines' K/V: freed from the head along the chain
                await self.client.call(a.nodes[0], StageFreeOp(pipeline=a.name, seq_ids=a.seq_ids))
            ep = self._endpoint(dep, a)
            ep.set_micro_batches(ep.num_micro_batches)  # head engines; the stages are open
            gone = [n for n in a.nodes if dep.instances.get(n) is None]
            if gone:  # a member went down (or was released) meanwhile
                raise RuntimeError(f"node {gone[0]} left it")
        except Exception as e:  # the autoscaler starts one instead
            log.warning("restart: pipeline %s on nodes %s not adopted: %s", a.name, a.nodes, e)
            for n in a.nodes:  # what is left of it serves no one
                if (inst := dep.instances.get(n)) is not None and inst.endpoint is None:
                    dep.instances.pop(n)
                with contextlib.suppress(Exception):
                    await self.client.call(n, StageCloseOp(pipeline=a.name))
                    await self.copies.release_slot(dep.name, n, dep.manifest.num_blocks)
            return
        now_s = self.clock.now_s()
        for n in a.nodes:  # one instance, every member's slot (as FlexPipe's pipelines)
            inst = dep.instances[n]
            inst.endpoint = ep  # type: ignore[assignment]
            inst.idle_since_s = _carried_idle_since_s(dep, n, now_s)
            dep.host_last_used_s[n] = now_s
            if not self.settled:  # before the autoscaler state is restored: `settle` then
                self.adopted.append((dep.name, n))
        await dep.server.add_endpoint(ep)
        if isinstance(ep, FlexPipeline):  # its layer times, as a new one's (§5)
            dep.spawn(_profile(ep))
        log.info(
            "restart: adopted pipeline %s on nodes %s (layers %s) with no load (%d of the old "
            "controller's sequences freed)", a.name, list(a.nodes),
            [f"{f}-{e - 1}" for _, f, e in a.stages], len(a.seq_ids),
        )  # fmt: skip

    def _endpoint(self, dep: Deployment, a: AdoptPipeline) -> PipelineEndpoint:
        """The endpoint a scale-out of `dep` opens over these stages: a FlexPipe pipeline
        (its stage key `name@version` after refactorings, its micro-batches for its stage
        count: `scaleout/flexpipe.py`), else an execution pipeline (λScale's, ParaServe's)."""
        where = (self.client, dep.manifest, dep.name)
        stages = list(a.stages)
        if dep.spec.system.group_sizing != "flexpipe":
            return PipelineEndpoint(*where, a.name, stages, self.engine)
        base, version = parse_stage_key(a.name)
        micro, most = micro_batches(dep.spec.system, dep.manifest, self.engine, len(stages))
        pipe = FlexPipeline(*where, base, stages, self.engine, micro, most)
        pipe.version = version
        return pipe

    def settle(self, deployments: Mapping[str, Deployment]) -> None:
        """Give each adopted instance, still idle, the idle time the restored autoscaler
        state carries for it (`policy.adoption.adopted_idle_since_s`)."""
        now_s = self.clock.now_s()
        for name, node in self.adopted:
            dep = deployments.get(name)
            inst = dep.instances.get(node) if dep is not None else None
            if inst is None or inst.endpoint is None or inst.endpoint.outstanding:
                continue
            inst.idle_since_s = _carried_idle_since_s(dep, node, now_s)
        self.adopted.clear()
        self.settled = True


def _carried_idle_since_s(dep: Deployment, node: int, now_s: float) -> float:
    """An adopted instance's idle time on `node`: the quiet time the restored autoscaler
    state carries for it (`policy.adoption.adopted_idle_since_s`)."""
    restart = dep.autoscale_state.restart
    return adopted_idle_since_s(None if restart is None else restart.quiet_of(node), now_s)


def failed_pipeline_nodes(dep: Deployment) -> list[int]:
    """Nodes whose instance is an adopted pipeline its router no longer routes to (a step
    failed or a member went down: `Server` retired it): the autoscaler releases them at once
    (`Autoscaler.release` frees every member), not after their downscale delay. A
    scale-out's pipelines are never an instance's endpoint; FlexPipe's reaps its own."""
    return [
        n
        for n, i in dep.instances.items()
        if type(i.endpoint) is PipelineEndpoint  # type: ignore[comparison-overlap]
        and dep.server.endpoints.get(i.endpoint.name) is not i.endpoint
    ]


async def _profile(pipe: FlexPipeline) -> None:
    try:
        await profile_stages(pipe)
    except Exception as e:  # estimates stay in use
        log.warning("restart: profiling %s failed: %s", pipe.name, e)
