"""The controller's state as timeline events: what a dashboard that connects now is shown.

What flows: the controller's records (nodes, deployments, the parameter pool, instances,
the pipelines each router serves through) in; `TimelineEvent`s (`surge/events.py`) out,
in the order a page applies them. The live stream then carries only what changes
(`Controller.events`). Also the two events the controller builds from its own records
(`deployment_up`, `request_done`). Owned by control/.
"""

import time

from surge.control.pool import TIERS, ParameterPool
from surge.control.state import Deployment, TrackedRequest
from surge.events import (
    BlockLanded,
    DeploymentUp,
    InstanceUp,
    NodesKnown,
    PipelineOpened,
    RequestDone,
    TimelineEvent,
)
from surge.runtime.pipeline_endpoint import PipelineEndpoint


def deployment_up(dep: Deployment) -> DeploymentUp:
    """A deployment's strategy and its model's shape (blocks and their layers)."""
    blocks = dep.manifest.blocks
    return DeploymentUp(
        model=dep.name,
        strategy=dep.spec.strategy,
        num_blocks=len(blocks),
        num_layers=dep.manifest.arch.num_layers,
        block_layers=tuple((b.first_layer, b.end_layer) for b in blocks),
    )


def request_done(req: TrackedRequest) -> RequestDone:
    """One finished request's TTFT and mean inter-token latency (seconds)."""
    ttft = None if req.first_token_t is None else req.first_token_t - req.arrival_t
    times = req.token_times
    itl = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return RequestDone(
        model=req.deployment, ttft_s=ttft, itl_s=itl, num_tokens=len(req.output_token_ids)
    )


def snapshot(
    nodes: list[int],
    deployments: dict[str, Deployment],
    pool: ParameterPool,
    t0_s: float,
) -> list[TimelineEvent]:
    """Everything that holds now, stamped now (`t0_s`: the bus's start, monotonic)."""
    t_s = round(time.monotonic() - t0_s, 6)
    out: list[TimelineEvent] = [NodesKnown(t_s=t_s, nodes=tuple(nodes))]
    for dep in deployments.values():
        if dep.manifest is None:
            continue
        out.append(deployment_up(dep))
        for node in nodes:
            for tier in TIERS:
                for b in sorted(pool.blocks_at(dep.name, node, tier)):
                    out.append(BlockLanded(model=dep.name, node=node, block=b, tier=tier))
        for inst in dep.instances.values():
            if inst.endpoint is not None:
                out.append(InstanceUp(model=dep.name, node=inst.node, name=inst.endpoint.name))
        for ep in dep.server.endpoints.values():
            if isinstance(ep, PipelineEndpoint):
                stages = tuple(tuple(s) for s in ep.stages)
                out.append(PipelineOpened(model=dep.name, name=ep.name, stages=stages))  # type: ignore[arg-type]
    for ev in out:
        object.__setattr__(ev, "t_s", t_s)
    return out
