"""Moving running requests with their KV caches: pipeline consolidation and live scaling.

Pipeline consolidation (ParaServe §6): once members of a pipeline hold the whole model
(they loaded the rest in the background while the pipeline served), `consolidate` gathers
each running request's KV cache — every stage's layers — onto one full instance and lets
it decode on from there, no recomputation. Scale-down: one target (the other members are
released); scale-up: every member is a target and the requests are spread over them.

Live scaling (BlitzScale §4, §5.2): `live_prefill` runs a batch's prefill cooperatively —
the new instance, still loading layers in order, runs the first T layers, the overloaded
old instance the remaining L - T — then moves the new instance's KV to the old one, where
the requests decode. T, the batch and the old instance come from
`policy.blitzscale.live_scaling.LiveScalingState.look`; `runtime/scaleout/live.py` carries
its `RunBatch` out here.

Controller side. The K/V goes agent to agent: the adopting instance's agent pulls each
stage's part itself (`instance_adopt` with `sources`). Only a live prefill whose requests
go to a P/D decode instance (`deliver`) still relays its K/V through the controller (the
P/D hand-off holds parts and bytes until a decode instance has room).
"""

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable

import numpy as np

from surge.engine.batch import BatchMeta
from surge.model.manifest import Manifest
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.failures import failure_level
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.protocol import (
    InstanceAdoptOp,
    KvExportOp,
    KvPart,
    KvSource,
    StageCloseOp,
    StageOpenOp,
    StageStepOp,
)
from surge.runtime.request import ServeRequest
from surge.runtime.server import Server
from surge.runtime.transport import RemoteError

log = logging.getLogger(__name__)

Deliver = Callable[[ServeRequest, list[KvPart], bytes, int], Awaitable[None]]
"""How a live batch's request reaches its P/D decode instance: (request, K/V parts, their
bytes, tokens cached) -> adopted (`PdServing.hold`)."""


async def adopt(
    server: Server,
    target: LocalEndpoint,
    req: ServeRequest,
    *,
    num_cached: int,
    parts: list[KvPart] | None = None,
    payload: bytes = b"",
    sources: tuple[KvSource, ...] = (),
    pace: float = 1.0,
) -> None:
    """`target` continues `req` with its K/V: `parts` + `payload` sent from here (paced as
    `pace` times its bytes: GPU-time emulation's K/V charge), or `sources` its agent pulls
    from the stages itself."""
    target.requests[req.req_id] = req  # before the call: tokens may stream at once
    endpoint, num_hops = req.endpoint, len(req.hops)
    req.endpoint = target.name
    req.hops.append(target.name)
    adopt = InstanceAdoptOp(
        instance=target.name,
        req_id=req.req_id,
        prompt_token_ids=tuple(req.prompt_token_ids),
        output_token_ids=tuple(req.output_token_ids),
        num_cached=num_cached,
        parts=tuple(parts or ()),
        params=req.params,
        sources=sources,
    )
    try:
        await server.client.call_bytes(target.node, adopt, payload, pace)
    except BaseException:
        target.requests.pop(req.req_id, None)  # the agent does not hold it: not the target's
        req.endpoint = endpoint
        del req.hops[num_hops:]
        raise


async def _export(
    server: Server, node: int, pipeline: str, seq_id: int, num_tokens: int
) -> tuple[KvPart, bytes]:
    op = KvExportOp(pipeline=pipeline, seq_id=seq_id, num_tokens=num_tokens)
    part, body = await server.client.call_bytes(node, op)
    return part, bytes(body)


async def consolidate(
    server: Server, pipeline: PipelineEndpoint, targets: list[LocalEndpoint]
) -> dict[str, int]:
    """Move a pipeline's running requests, KV cache and all, onto full instances (ParaServe
    §6) and close the pipeline. Targets must already serve (instance open, every block).
    Requests without a usable cache (not prefilled yet, or preempted) are routed again and
    recompute. Returns counts of migrated and re-routed requests."""
    for t in targets:
        if t.name not in server.endpoints:
            await server.add_endpoint(t)
    server.endpoints.pop(pipeline.name, None)
    migrated = rerouted = 0
    for i, (req, sid) in enumerate(pipeline.detach()):
        target = targets[i % len(targets)]
        num_cached = len(req.prompt_token_ids) + len(req.output_token_ids) - 1
        if sid < 0 or not req.output_token_ids:
            server.put_back([req])
            rerouted += 1
            continue
        sources = tuple(
            KvSource(node=node, pipeline=pipeline.name, seq_id=sid, num_tokens=num_cached)
            for node, _, _ in pipeline.stages
        )
        try:  # the target's agent pulls every stage's part, agent to agent
            await adopt(server, target, req, num_cached=num_cached, sources=sources)
        except Exception as e:  # a stage lost it (preempted), an agent died, or the target
            # refused another version's K/V: recompute
            log.log(failure_level(e), "KV of %s not movable (%s); recomputing", req.req_id, e)
            server.put_back([req])  # unless a retirement during the call requeued it
            rerouted += 1
            continue
        migrated += 1
    await pipeline.close_stages()
    await server.dispatch()
    return {"migrated": migrated, "rerouted": rerouted}


async def live_prefill(
    server: Server,
    manifest: Manifest,
    new_node: int,
    old: LocalEndpoint,
    num_layers_on_new: int,
    reqs: list[ServeRequest],
    deliver: Deliver | None = None,
    keep: bool = True,
) -> tuple[tuple[int, float, float], ...]:
    """Prefill `reqs` with the first T layers on `new_node` and the rest on `old`'s node
    (whose stage picks each first token), then hand the requests (with their whole KV
    cache) to `old`, which decodes them (BlitzScale §4 live autoscaling): its agent adopts
    each, its own layers' K/V in place, the new node's pulled agent to agent. Under P/D
    (`deliver` given) that is so only with `keep` (`old` decodes, and has room for the
    request); else `deliver(req, parts, payload, num_cached)` hands it to a decode
    instance (`runtime/migration/pd_handoff.py`).
    Returns the (node, start, end) wall-clock spans of the two stages' compute."""
    if not keep and deliver is None:
        raise ValueError("a live batch that `old` does not keep needs `deliver`")
    L = manifest.arch.num_layers
    T = num_layers_on_new
    if not 1 <= T < L:
        raise ValueError(f"the new instance must run 1..{L - 1} layers (got {T})")
    client = server.client
    name = f"live-{secrets.token_hex(3)}"
    # Each node runs its live batches' layers one batch at a time (BlitzScale Fig. 12b:
    # the target on batch i+1 while the source is on batch i, never two on one side).
    # Both stages open at once, on pooled connections: batches under way together must
    # not queue behind each other's calls on the nodes' control connections.
    group = f"live-{server.model}"
    await asyncio.gather(
        client.call_bytes(
            new_node,
            StageOpenOp(
                pipeline=name,
                model=server.model,
                first_layer=0,
                end_layer=T,
                next_node=old.node,
                compute_group=group,
                digest=manifest.digest,
            ),
        ),
        client.call_bytes(
            old.node,
            StageOpenOp(
                pipeline=name,
                model=server.model,
                first_layer=T,
                end_layer=L,
                compute_group=group,
                digest=manifest.digest,
            ),
        ),
    )
    try:
        seq_ids = tuple(range(len(reqs)))
        q = max(len(r.prompt_token_ids) for r in reqs)
        tokens = np.zeros((len(reqs), q), dtype=np.int64)
        for b, r in enumerate(reqs):
            tokens[b, : len(r.prompt_token_ids)] = r.prompt_token_ids
        batch = BatchMeta(seq_ids, (0,) * len(reqs), tuple(len(r.prompt_token_ids) for r in reqs))
        draws = tuple(r.params.draw() for r in reqs)  # the old instance's stage picks
        step = StageStepOp(
            pipeline=name, kind="tokens", shape=tokens.shape, batch=batch, draws=draws
        )
        reply, _ = await client.call_bytes(new_node, step, tokens)
        first = reply.sampled
        # Every first token of the batch is out when its prefill ends (BlitzScale §4: the
        # batch's TTFT), before any hand-off: a hand-off moves K/V and, under P/D, waits
        # for decode room, so first tokens stamped between them came one hand-off apart.
        for b, (r, tok) in enumerate(zip(reqs, first.tokens, strict=True)):
            r.hops.append(name)
            if (lp := first.logprobs_of(b)) is not None:
                r.add_logprobs(lp)
            stop = not r.params.ignore_eos and tok in manifest.arch.eos_token_ids
            r.add_token(tok, stop or r.params.max_tokens == 1, "stop" if stop else "length")
        for b, r in enumerate(reqs):
            if r.done.is_set():
                continue
            n = len(r.prompt_token_ids)
            if keep:  # the old instance's agent pulls both parts itself
                sources = tuple(
                    KvSource(node=node, pipeline=name, seq_id=b, num_tokens=n)
                    for node in (new_node, old.node)
                )
                try:
                    await adopt(server, old, r, num_cached=n, sources=sources)
                    continue
                except RemoteError:  # no room there now: a decode instance that has room
                    if deliver is None:
                        raise
            parts = await asyncio.gather(
                _export(server, new_node, name, b, n), _export(server, old.node, name, b, n)
            )
            await deliver(r, [p for p, _ in parts], b"".join(x for _, x in parts), n)
        return reply.spans
    finally:
        for node in (new_node, old.node):
            await client.call_bytes(node, StageCloseOp(pipeline=name))
