"""A scale-out that serves while the model arrives (λScale §4.3-§4.4), or after (baseline).

In: a running `Server`, a planned multicast (`MulticastOutcome` from `surge.policy`, plan
node i = agent i, sources 0..K-1 already serving), and a mode:
- `execute_while_load`: each of the plan's execution pipelines opens as soon as its
  members hold their stages' blocks (arrival events), and takes queued and new requests;
  a node that holds every block becomes a local instance, and every open pipeline it
  belongs to is retired — its requests move to complete members (mode switch);
- `stop_the_world`: a node serves only once it holds the whole model (the ServerlessLLM /
  FaaSNet / NCCL behaviour).
Out: a `ScaleOutReport` — the multicast result and when each endpoint opened or retired.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field

from surge.config import EngineConfig
from surge.model.manifest import Manifest
from surge.policy.multicast import MulticastOutcome
from surge.policy.pipelines import Pipeline
from surge.runtime.multicast import MulticastExecutor, MulticastResult
from surge.runtime.serving import LocalEndpoint, PipelineEndpoint, Server

log = logging.getLogger(__name__)

MODES = ("execute_while_load", "stop_the_world")


@dataclass
class ScaleOutReport:
    """What a scale-out did, in seconds from its start."""

    mode: str
    multicast: MulticastResult | None = None
    opened: list[tuple[str, float, tuple[int, ...]]] = field(default_factory=list)
    """(endpoint, time, nodes) in the order endpoints opened."""
    retired: list[tuple[str, float, int]] = field(default_factory=list)
    """(pipeline, time, requests moved) for every mode switch."""
    pipeline_order: list[int] = field(default_factory=list)
    """Indices into the plan's pipelines, in the order they opened."""


def stage_layers(
    manifest: Manifest, pipeline: Pipeline, agents: list[int] | None = None
) -> list[tuple[int, int, int]]:
    """(agent, first_layer, end_layer) of each stage of a planned pipeline."""
    blocks = manifest.blocks
    return [
        (
            s.node if agents is None else agents[s.node],
            blocks[s.first_block].first_layer,
            blocks[s.last_block].end_layer,
        )
        for s in pipeline.stages
    ]


async def scale_out(
    server: Server,
    manifest: Manifest,
    outcome: MulticastOutcome,
    mode: str = "execute_while_load",
    engine: EngineConfig = EngineConfig(),
    num_micro_batches: int = 2,
    timeout_s: float = 300.0,
    agents: list[int] | None = None,
) -> ScaleOutReport:
    """Multicast the model to the plan's destinations and open capacity as it becomes usable.

    `agents[i]` is the agent that plays plan node i (default: agent i); sources first."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    client, model, plan = server.client, server.model, outcome.plan
    report = ScaleOutReport(mode)
    events = client.listen()
    agents = list(agents) if agents is not None else list(range(plan.num_nodes))
    plan_node = {a: i for i, a in enumerate(agents)}
    executor = MulticastExecutor(
        client, model, plan, agents, tier="gpu", pipelines=outcome.pipelines, timeout_s=timeout_s
    )
    n, b = plan.num_nodes, plan.num_blocks
    holds = [set(range(b)) if v < plan.num_sources else set() for v in range(n)]
    pending = list(enumerate(outcome.pipelines)) if mode == "execute_while_load" else []
    open_pipes: dict[str, Pipeline] = {}
    start = time.monotonic()
    task = asyncio.get_running_loop().create_task(executor.run())

    def complete(v: int) -> bool:
        return len(holds[v]) == b

    async def on_arrival(v: int, block: int) -> None:
        holds[v].add(block)
        for item in list(pending):
            index, pipe = item
            if any(complete(s.node) for s in pipe.stages):
                pending.remove(item)  # a member is already whole: it serves alone instead
                continue
            if all(
                set(range(s.first_block, s.last_block + 1)) <= holds[s.node] for s in pipe.stages
            ):
                pending.remove(item)
                name = f"{model}-pipe{index}"
                ep = PipelineEndpoint(
                    client,
                    manifest,
                    model,
                    name,
                    stage_layers(manifest, pipe, agents),
                    engine,
                    num_micro_batches,
                )
                t0 = time.monotonic()
                await ep.open()
                await server.add_endpoint(ep)
                log.info("opened %s on %s in %.3f s", name, ep.nodes, time.monotonic() - t0)
                open_pipes[name] = pipe
                report.opened.append((name, time.monotonic() - start, ep.nodes))
                report.pipeline_order.append(index)
        if complete(v):
            name = f"{model}-node{agents[v]}"
            ep = LocalEndpoint(client, agents[v], model, name, capacity=engine.max_num_seqs)
            t0 = time.monotonic()
            await ep.open()
            await server.add_endpoint(ep)
            log.info("opened %s in %.3f s", name, time.monotonic() - t0)
            report.opened.append((name, time.monotonic() - start, (agents[v],)))
            for pname, pipe in list(open_pipes.items()):
                if v in pipe.nodes:  # mode switch (λScale §4.4)
                    del open_pipes[pname]
                    t0 = time.monotonic()
                    moved = await server.retire(pname)
                    log.info(
                        "retired %s (%d moved) in %.3f s", pname, len(moved), time.monotonic() - t0
                    )
                    report.retired.append((pname, time.monotonic() - start, len(moved)))

    try:
        while True:
            if task.done() and events.empty():
                break
            try:
                ev = await asyncio.wait_for(events.get(), 0.2)
            except TimeoutError:
                continue
            if ev.get("type") == "arrival" and ev.get("mc_id") == executor.mc_id:
                await on_arrival(plan_node[ev["node"]], ev["block"])
        report.multicast = task.result()
    finally:
        client.unlisten(events)
        if not task.done():
            task.cancel()
    return report
