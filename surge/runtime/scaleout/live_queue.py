"""The requests BlitzScale live scaling may take, and where each waits (§4 step 1, §5.2).

In: the `Server` (its router's queue) and the serving local instances (`LocalEndpoint`s:
what each one's agent holds queued, `LocalEndpoint.queued`). Out: the requests that have
not started, each with where it waits (`Queued`; "we redirect all queued requests from
inst.0", §4 step 1), as the policy sees them (`waiting_view`: `policy.blitzscale.live_scaling
.Waiting`), and the chosen ones taken — off the router's queue (`Server.take`) or back from
their agents (`LocalEndpoint.take_queued`, which does not wait for that agent's step). An
agent that does not answer holds none. Used by `runtime/scaleout/live.py`'s `LiveScaling`,
for a live batch (`step`) and for the redistribution once the new instance is whole
(`redistribute`, §5.2 step 3).
"""

import asyncio
import logging

from surge.policy.blitzscale.live_pair import Waiting
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.request import ServeRequest
from surge.runtime.server import Server

log = logging.getLogger(__name__)

Queued = tuple[ServeRequest, LocalEndpoint | None]
"""A request that has not started and where it waits (None: the router's queue)."""


def waiting_view(queued: list[Queued]) -> tuple[Waiting, ...]:
    """`queued` as the policy sees it (`Waiting.source`: the source's node)."""
    return tuple(
        Waiting(r.arrival_t, len(r.prompt_token_ids), None if e is None else e.node)
        for r, e in queued
    )


async def queued_on(eps: list[LocalEndpoint]) -> list[Queued]:
    """What each instance's agent holds queued, not started (`LocalEndpoint.queued`); an
    agent that does not answer (it died: failover retires it) holds none."""
    found = await asyncio.gather(*(e.queued() for e in eps), return_exceptions=True)
    out: list[Queued] = []
    for e, reqs in zip(eps, found, strict=True):
        if isinstance(reqs, BaseException):
            log.info("%s: its queue could not be read (%r)", e.name, reqs)
            continue
        out.extend((r, e) for r in reqs)
    return out


async def take_back(chosen: list[Queued]) -> list[ServeRequest]:
    """Take the chosen requests queued on instances back from their agents: those not
    started meanwhile (`LocalEndpoint.take_queued`)."""
    eps = list({id(e): e for _, e in chosen if e is not None}.values())
    got = await asyncio.gather(
        *(e.take_queued([r for r, at in chosen if at is e]) for e in eps),
        return_exceptions=True,
    )
    return [r for reqs in got if not isinstance(reqs, BaseException) for r in reqs]


def routed(server: Server) -> list[Queued]:
    """The router's queue's requests that have not started, FIFO."""
    return [(r, None) for r in server.queue if not r.output_token_ids and not r.done.is_set()]


async def not_started(server: Server, olds: list[LocalEndpoint]) -> list[Queued]:
    """Requests that have not started, each with where it waits: the router's queue
    (None), then what each source's agent holds queued (§4 step 1)."""
    return routed(server) + await queued_on(olds)


async def take(server: Server, chosen: list[Queued]) -> list[ServeRequest]:
    """Take the chosen requests for a live batch, in their order: off the router's queue
    (those still there, now, so the next look sees them gone), back from each source's
    agent (those it has not started meanwhile)."""
    queue = {id(r) for r in server.queue}
    on_router = [r for r, at in chosen if at is None and id(r) in queue]
    server.take(on_router)
    got = {id(r) for r in on_router} | {id(r) for r in await take_back(chosen)}
    return [r for r, _ in chosen if id(r) in got]
