"""The serving front of one model: a FIFO queue, routing, mode switch and failover.

What flows: `ServeRequest`s come in (`submit`); each goes to the endpoint that
`surge.policy.router.route` picks among the live endpoints with room (the one router the
simulator uses too), or waits in FIFO order until one has room. Endpoints come and go
during a scale-out (λScale §4.3-§4.4): `retire` takes an endpoint's unfinished requests
back (tokens so far included) and either spreads them evenly over the endpoints named
(a pipeline's members' local instances at a mode switch, `policy.loading.spread_evenly`)
or routes them again ahead of the queue, so they continue elsewhere by rebuilding their
KV cache with one prefill over prompt + output. An endpoint
that fails (an agent died, `AgentDown`) is retired the same way: nothing is lost or
duplicated, because a request's tokens are only appended once a step has come back.

The server also keeps the model's recent arrival times (`arrival_times_s`), the sliding
window ParaServe's §6.1 predictor reads. Owned by the runtime.
"""

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from typing import Protocol

from surge.engine.sampling import SamplingParams
from surge.policy import router
from surge.policy.loading import spread_evenly
from surge.runtime.client import ClusterClient
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.endpoints import Endpoint, LocalEndpoint
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.protocol import AgentDown, RequestFailed, TokenGenerated
from surge.runtime.request import ServeRequest

log = logging.getLogger(__name__)

SUBMIT_RETRY_S = 0.01
"""After a failed submit the dispatcher waits this long before routing again: an endpoint
whose agent just died fails at once, without awaiting anything, and routing back to it in
a tight loop would starve the event pump that retires it (`agent_down`)."""
MAX_ARRIVALS_KEPT = 10_000
"""Arrival times remembered for the predictor's window (older ones drop off)."""
MAX_SPANS_KEPT = 64
"""Recent prefill spans kept for the measured prefill time."""


class PdRouting(Protocol):
    """A deployment's P/D disaggregation as its `Server` and the code around it see it
    (`runtime/migration/pd_handoff.py` `PdServing`; BlitzScale §5.2, §6). A protocol, so the server
    does not import the hand-off (which imports the server's consolidation)."""

    roles: dict[str, str]
    """Local instance name -> its P/D role."""
    pending: list[tuple[LocalEndpoint, ServeRequest]]
    """Requests parked after their prefill on the endpoint that holds their K/V."""

    def routable(self, live: dict[int, Endpoint]) -> dict[int, Endpoint]: ...

    async def assign(self, ep: LocalEndpoint) -> None: ...

    def forget(self, name: str) -> None: ...

    def on_token(self, ep: Endpoint, ev: TokenGenerated) -> None: ...

    def kick(self) -> None: ...

    def egress_handoffs(self) -> dict[int, int]: ...

    async def hold(
        self, req: ServeRequest, parts: list, payload: bytes, num_cached: int, old: LocalEndpoint
    ) -> None: ...

    async def close(self) -> None: ...


class Server:
    """Routes requests of one model over its live endpoints (`policy.router.route`)."""

    def __init__(
        self,
        client: ClusterClient,
        model: str,
        routing: str = "least-loaded",
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.client, self.model = client, model
        self.clock = clock
        """The serving plane's clock (`runtime/clock.py`): its requests' times and every
        time the deployment's scale-outs read."""
        self.routing = routing
        """The system's routing rule (`SystemConfig.routing`, `policy.router.ROUTINGS`)."""
        self.endpoints: dict[str, Endpoint] = {}
        self.queue: list[ServeRequest] = []
        self.requests: dict[str, ServeRequest] = {}
        self.arrivals: deque[float] = deque(maxlen=MAX_ARRIVALS_KEPT)
        """Arrival times (`clock`) of the requests submitted, oldest first."""
        self.departures: deque[float] = deque(maxlen=MAX_ARRIVALS_KEPT)
        """When queued requests left the queue for an endpoint (`clock`), oldest first:
        how fast the queue drains (BlitzScale's live-scaling SLO check)."""
        self.prefill_spans: deque[tuple[float, float, int]] = deque(maxlen=MAX_SPANS_KEPT)
        """(handed to a local instance, first token, tokens prefilled) of recent requests:
        the serving instances' measured prefill time (live scaling's Time_l)."""
        self._ids = itertools.count()
        self.pd: PdRouting | None = None
        """P/D disaggregation (`runtime/migration/pd_handoff.py`), when the deployment runs it."""
        self._events = client.subscribe((TokenGenerated, RequestFailed, AgentDown), model=model)
        self._pump = asyncio.get_running_loop().create_task(self._pump_events())

    def new_request(self, prompt_token_ids: list[int], params: SamplingParams) -> ServeRequest:
        req = ServeRequest(f"r{next(self._ids)}", list(prompt_token_ids), params, clock=self.clock)
        self.requests[req.req_id] = req
        return req

    async def submit(self, req: ServeRequest) -> None:
        """Route a request now if some endpoint has room, else queue it (FIFO)."""
        req.on_done = self.dispatch_soon
        self.arrivals.append(req.arrival_t)
        self.queue.append(req)
        await self.dispatch()

    def dispatch_soon(self) -> None:
        """Route the queue on the next loop iteration: for room that opened where nothing
        awaits (a request finished; under P/D a prefilled request's hand-off took it off its
        prefill instance, `pd_handoff.PdServing`)."""
        asyncio.get_running_loop().create_task(self.dispatch())

    async def dispatch(self) -> None:
        """Give queued requests, oldest first, to the endpoints the router picks."""
        while self.queue:
            # Endpoint ids are their age (`endpoints` keeps insertion order): the router
            # breaks ties to the oldest, as in the simulator, whose ids count up too.
            live = {i: e for i, e in enumerate(self.endpoints.values()) if not e.failed}
            if self.pd is not None:  # new requests go to prefill instances
                live = self.pd.routable(live)
            choice = router.route(
                [
                    router.Endpoint(
                        i, e.outstanding, e.capacity, e.speed, e.route_target, e.num_stages
                    )
                    for i, e in live.items()
                ],
                self.routing,
            )
            if choice is None:
                return
            ep = live[choice]
            req = self.queue.pop(0)
            req.dispatched_t = self.clock.now_s()
            self.departures.append(req.dispatched_t)
            req.endpoint = ep.name
            req.hops.append(ep.name)
            try:
                await ep.submit(req)
            except Exception as e:  # raced with a failure: route again
                log.info("submit to %s failed (%s); routing again", ep.name, e)
                ep.requests.pop(req.req_id, None)
                # While the call was out, the endpoint may have been retired and this
                # request taken back into the queue already: queued twice, it would be
                # served twice, every token doubled (seen in CI after a P/D kill).
                if self.unplaced(req):
                    self.queue.insert(0, req)
                await asyncio.sleep(SUBMIT_RETRY_S)  # let the failure be seen first

    def drop(self, req: ServeRequest) -> bool:
        """Take `req` off the queue (it will not be routed); whether it was queued. The
        queue is the server's: other code drops, takes and puts back through these."""
        n = len(self.queue)
        self.queue[:] = [r for r in self.queue if r is not req]
        return len(self.queue) < n

    def take(self, reqs: list[ServeRequest]) -> None:
        """Take these requests off the queue to serve them elsewhere (BlitzScale's live
        batches)."""
        ids = {id(r) for r in reqs}
        self.queue[:] = [r for r in self.queue if id(r) not in ids]

    def put_back(self, reqs: list[ServeRequest]) -> list[ServeRequest]:
        """Put requests back at the head of the queue, in order (they were admitted before
        anything still queued), without routing them yet: only those unfinished, not queued
        and on no endpoint (`unplaced`). Returns those put back."""
        back = [r for r in reqs if self.unplaced(r)]
        self.queue[:0] = back
        return back

    def unplaced(self, req: ServeRequest) -> bool:
        """Whether nobody holds `req`: unfinished, not queued and on no endpoint. Whoever
        puts a request back after a failed call asks first: a retirement running during
        that call may have requeued it already."""
        if req.done.is_set() or any(r is req for r in self.queue):
            return False
        return not any(req.req_id in e.requests for e in self.endpoints.values())

    async def requeue(self, reqs: list[ServeRequest]) -> None:
        """Put requests back at the head of the queue (they were admitted before anything
        queued) — only those unfinished, not queued and on no endpoint — and route them."""
        self.put_back(reqs)
        await self.dispatch()

    async def add_endpoint(self, ep: Endpoint) -> None:
        if self.pd is not None and isinstance(ep, LocalEndpoint):
            await self.pd.assign(ep)  # its P/D role before its first request
        self.endpoints[ep.name] = ep
        if isinstance(ep, PipelineEndpoint):
            ep.on_failure = self._endpoint_failed
        if self.pd is not None:  # a hand-off may have waited for this (decode) instance
            self.pd.kick()
        await self.dispatch()

    async def retire(self, name: str, spread_over: tuple[str, ...] = ()) -> list[ServeRequest]:
        """Take an endpoint out; its unfinished requests continue elsewhere: spread evenly
        over the live endpoints named in `spread_over` (λScale §4.4 mode switch), or, with
        none of them live (a failure, P/D roles), back at the head of the queue."""
        ep = self.endpoints.pop(name, None)
        if ep is None:
            return []
        if self.pd is not None:
            self.pd.forget(name)
        back = await ep.take_back()
        targets = [self.endpoints[n] for n in spread_over if n in self.endpoints]
        targets = [t for t in targets if not t.failed]
        if targets and self.pd is None:
            moved = await self._spread(back, targets)
        else:
            # Moved requests go first: they were admitted before anything still queued.
            moved = self.put_back(back)
        await self.dispatch()
        return moved

    async def _spread(
        self, reqs: list[ServeRequest], targets: list[Endpoint]
    ) -> list[ServeRequest]:
        """Hand `reqs` (admission order) to `targets` as `spread_evenly` says, past the
        router: each target recomputes its share's KV cache (λScale §4.4). Those no
        target has room for, and any whose hand-over fails, go to the head of the queue."""
        moved = [r for r in reqs if self.unplaced(r)]
        where = spread_evenly(
            len(moved),
            tuple(t.outstanding for t in targets),
            tuple(t.capacity for t in targets),
        )
        self.put_back([r for r, i in zip(moved, where, strict=True) if i is None])
        for req, i in zip(moved, where, strict=True):
            if i is None:
                continue
            ep = targets[i]
            req.dispatched_t = self.clock.now_s()
            req.endpoint = ep.name
            req.hops.append(ep.name)
            try:
                await ep.submit(req)
            except Exception as e:  # the target failed meanwhile: route it instead
                log.info("mode-switch hand-over to %s failed (%s); queueing", ep.name, e)
                ep.requests.pop(req.req_id, None)
                self.put_back([req])
        return moved

    async def _endpoint_failed(self, ep: Endpoint) -> None:
        log.warning("endpoint %s failed; re-running its requests elsewhere", ep.name)
        await self.retire(ep.name)

    async def _pump_events(self) -> None:
        while True:
            ev = await self._events.get()
            if isinstance(ev, TokenGenerated):
                ep = self.endpoints.get(ev.instance)
                if isinstance(ep, LocalEndpoint):
                    req = ep.requests.get(ev.req_id)
                    first = req is not None and not req.output_token_ids
                    ep.on_token(ev)
                    if first and req is not None and req.dispatched_t is not None:
                        self._prefilled(req)
                    if self.pd is not None:
                        self.pd.on_token(ep, ev)
            elif isinstance(ev, RequestFailed):
                ep = self.endpoints.get(ev.instance)
                if isinstance(ep, LocalEndpoint):
                    ep.on_failed(ev)
            elif isinstance(ev, AgentDown):
                for ep in list(self.endpoints.values()):
                    if ev.node in ep.nodes:
                        ep.failed = True
                        await self.retire(ep.name)

    def _prefilled(self, req: ServeRequest) -> None:
        """A request's first token came back from a local instance: record its prefill."""
        assert req.dispatched_t is not None and req.first_token_t is not None
        tokens = len(req.prompt_token_ids) - (req.cached_tokens or 0)
        self.prefill_spans.append((req.dispatched_t, req.first_token_t, tokens))

    async def wait_all(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(r.done.wait() for r in self.requests.values()))

    async def close(self) -> None:
        if self.pd is not None:
            await self.pd.close()
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
        self.client.unsubscribe(self._events)
        for name in list(self.endpoints):
            ep = self.endpoints.pop(name)
            with contextlib.suppress(Exception):
                await ep.take_back()
