"""Endpoints: what serves requests of one model right now.

What flows: the `Server` (`runtime/server.py`) hands a `ServeRequest` to an endpoint; the
endpoint runs it and appends tokens to it as they come back.
- `LocalEndpoint`: a full instance inside one agent (`InstanceOpenOp`); tokens arrive as
  `TokenGenerated` events, which the server hands to `on_token`.
- `PipelineEndpoint` (`runtime/pipeline_endpoint.py`): an execution pipeline across agents.
`take_back` stops an endpoint and returns its unfinished requests with their tokens so far,
so they continue elsewhere (mode switch, failover) with none lost or repeated. Owned by the
runtime; the typed ops are `runtime/protocol/`'s.
"""

from __future__ import annotations

import contextlib
import logging

from surge.engine.sampling import TokenLogprobs
from surge.runtime.client import ClusterClient
from surge.runtime.protocol import (
    InstanceAbortOp,
    InstanceOpenOp,
    InstanceQueuedOp,
    InstanceSubmitOp,
    InstanceTakeQueuedOp,
    RequestFailed,
    TokenGenerated,
)
from surge.runtime.request import ServeRequest
from surge.runtime.transport import RemoteError

log = logging.getLogger(__name__)

MAX_REFUSALS = 3
"""Agent refusals after which a request fails instead of being routed again."""


class EndpointFailed(RuntimeError):
    """An endpoint can no longer serve (a member agent died)."""


class Endpoint:
    """Something that serves requests of one model."""

    name: str
    nodes: tuple[int, ...]
    requests: dict[str, ServeRequest]
    failed: bool = False
    capacity: int = 1 << 30
    """Most requests in flight here; the server keeps the rest queued, so capacity that
    opens later (a new pipeline) gets work too."""
    speed: float = 1.0
    """Relative serving speed for the router (`policy.router`); a full instance is 1."""
    route_target: float | None = None
    """Requests a `pack` router fills it up to (`policy.router`; the controller sets it on
    FlexPipe pipelines from `groups.pipeline_target`)."""
    num_tokens: int = 0
    """Tokens generated here so far (the load monitor's tokens/s, `control/load_monitor.py`)."""

    @property
    def outstanding(self) -> int:
        return len(self.requests)

    @property
    def num_stages(self) -> int:
        """Stages working on requests at once, for the router (`policy.router` `pack`)."""
        return 1

    async def submit(self, req: ServeRequest) -> None:
        raise NotImplementedError

    async def take_back(self) -> list[ServeRequest]:
        """Stop serving; return the unfinished requests (their tokens are up to date)."""
        raise NotImplementedError


class LocalEndpoint(Endpoint):
    """A full instance inside one agent; tokens arrive as `TokenGenerated` events."""

    def __init__(
        self, client: ClusterClient, node: int, model: str, name: str, capacity: int = 64
    ) -> None:
        self.client, self.node, self.model, self.name = client, node, model, name
        self.nodes = (node,)
        self.requests = {}
        self.capacity = capacity
        self.live: list[ServeRequest] = []
        """Requests of BlitzScale live batches whose last layers run here (§4: the partner
        runs the rest), until their batch ends (`runtime/scaleout/live.py`): its load, as
        the simulator's engine holds them once their activation arrives."""

    @property
    def outstanding(self) -> int:
        """Its requests and the live batches' requests it runs the last layers of (those
        not adopted here yet, unfinished): the router's room, the load monitor's and the
        P/D views' load count them, not the router's queue (the simulator's `pool_load`).
        Until 2026-11-29 they counted as queued: on the emulated §6.1 7B run the partner
        took requests 15-18 at once while it held live batches 8-11 and 12-14 (the
        simulator's partner, full, took 15 at 1.361 s and 16-19 at 1.68)."""
        live = sum(1 for r in self.live if r.req_id not in self.requests and not r.done.is_set())
        return len(self.requests) + live

    async def open(self) -> None:
        await self.client.call(self.node, InstanceOpenOp(instance=self.name, model=self.model))

    async def submit(self, req: ServeRequest) -> None:
        self.requests[req.req_id] = req  # before the call: tokens may stream at once
        op = InstanceSubmitOp(
            instance=self.name,
            req_id=req.req_id,
            prompt_token_ids=tuple(req.prompt_token_ids),
            params=req.params,
            output_token_ids=tuple(req.output_token_ids),
        )
        try:
            await self.client.call(self.node, op)
        except RemoteError as e:
            # The agent answered and refused it. Once may be a race (the instance closing:
            # the server routes it again); refused again and again, it is the request (a
            # bad field) and routing it forever would hang it: fail it with the reason.
            req.refusals += 1
            if req.refusals < MAX_REFUSALS:
                raise
            self.requests.pop(req.req_id, None)
            log.warning("%s refused request %s: %s", self.name, req.req_id, e)
            req.fail(str(e))

    def on_failed(self, ev: RequestFailed) -> None:
        """The agent gave up on a request (its engine step raised): fail it with the
        agent's reason; the instance serves on."""
        req = self.requests.pop(ev.req_id, None)
        if req is not None:
            log.warning("%s failed request %s: %s", self.name, req.req_id, ev.error)
            req.fail(ev.error)

    def on_token(self, ev: TokenGenerated) -> None:
        req = self.requests.get(ev.req_id)
        if req is None:
            return
        if ev.logprob is not None:
            req.add_logprobs(TokenLogprobs(ev.logprob, ev.top_logprobs or ()))
        if ev.cached_tokens is not None:
            req.cached_tokens = ev.cached_tokens
        req.add_token(ev.token, ev.finished, ev.finish_reason)
        self.num_tokens += 1
        if ev.finished:
            del self.requests[req.req_id]

    async def take_back(self) -> list[ServeRequest]:
        return await self.abort(list(self.requests.values()))

    async def abort(self, reqs: list[ServeRequest]) -> list[ServeRequest]:
        """Stop serving these requests here (those it has; whether or not the agent ever
        got them) and return them; their tokens are what arrived so far."""
        reqs = [r for r in reqs if self.requests.pop(r.req_id, None) is not None]
        if not self.failed and reqs:
            op = InstanceAbortOp(instance=self.name, req_ids=tuple(r.req_id for r in reqs))
            with contextlib.suppress(Exception):  # it may have died meanwhile
                await self.client.call(self.node, op)
        return reqs

    async def queued(self) -> list[ServeRequest]:
        """Its requests the agent has not started, in the order it would start them. On a
        pooled connection, as `take_queued`: not behind a long op on the control one (a
        multicast's), which held a live look for seconds."""
        reply, _ = await self.client.call_bytes(self.node, InstanceQueuedOp(instance=self.name))
        return [self.requests[r] for r in reply.req_ids if r in self.requests]

    async def take_queued(self, reqs: list[ServeRequest]) -> list[ServeRequest]:
        """Take back those of `reqs` the agent has not started (it answers at once, not
        after its step in progress); they leave this endpoint, no token generated. Those
        taken (BlitzScale §4 step 1, §5.2 step 3: `runtime/scaleout/live.py`)."""
        ids = tuple(r.req_id for r in reqs if r.req_id in self.requests)
        op = InstanceTakeQueuedOp(self.name, ids)
        reply, _ = await self.client.call_bytes(self.node, op)
        return [self.requests.pop(r) for r in reply.req_ids if r in self.requests]
