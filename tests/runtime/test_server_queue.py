"""`Server` owns its queue: `drop`, `take` and `put_back` are the only ways other code
changes it (admission, stop strings, live batches, consolidation and retirement)."""

import asyncio

from surge.engine.sampling import SamplingParams
from surge.runtime.client import ClusterClient
from surge.runtime.endpoints import Endpoint
from surge.runtime.request import ServeRequest
from surge.runtime.server import Server


class Holding(Endpoint):
    """An endpoint that holds whatever it is given and never answers."""

    def __init__(self, name: str) -> None:
        self.name, self.nodes, self.requests = name, (0,), {}


def _server() -> Server:
    client = ClusterClient.__new__(ClusterClient)
    client._subs = []  # subscribe only
    return Server(client, "m")


def test_drop_take_and_put_back_keep_one_copy_of_each_request_in_order() -> None:
    async def run() -> None:
        server = _server()
        a, b, c, d = (server.new_request([1], SamplingParams()) for _ in range(4))
        server.queue[:] = [a, b, c]
        assert server.drop(b) and not server.drop(b)  # a second drop finds nothing
        assert server.queue == [a, c]
        server.take([c, a])
        assert server.queue == []
        held = Holding("held")
        held.requests[d.req_id] = d
        server.endpoints["held"] = held
        server.queue[:] = [c]
        done = ServeRequest("done", [1], SamplingParams())
        done.done.set()
        # Only the unplaced come back, at the head, in the order given: `c` is queued
        # already, `d` is on an endpoint, `done` is finished.
        assert server.put_back([b, c, d, done, a]) == [b, a]
        assert server.queue == [b, a, c]
        server._pump.cancel()

    asyncio.run(run())


class Taking(Holding):
    """Holds what it is given; `take_back` hands it all back (a pipeline retiring)."""

    async def submit(self, req: ServeRequest) -> None:
        self.requests[req.req_id] = req

    async def take_back(self) -> list[ServeRequest]:
        back = list(self.requests.values())
        self.requests.clear()
        return back


def test_a_mode_switch_spreads_the_pipelines_requests_evenly_over_its_members() -> None:
    """λScale §4.4: a retired pipeline's unfinished requests go evenly to its members'
    local instances (each recomputes its share), not back to the global queue where the
    router would pile them on whichever endpoint is least loaded (`other`, idle here);
    only what the members have no room for goes to the queue."""

    async def run() -> None:
        server = _server()
        pipe, a, b, other = Taking("pipe"), Taking("a"), Taking("b"), Taking("other")
        for ep in (pipe, a, b, other):
            server.endpoints[ep.name] = ep
        a.capacity = b.capacity = 3
        busy = server.new_request([1], SamplingParams())
        a.requests[busy.req_id] = busy  # `a` went local first and serves one already
        reqs = [server.new_request([1], SamplingParams()) for _ in range(6)]
        for r in reqs:
            pipe.requests[r.req_id] = r
        moved = await server.retire("pipe", spread_over=("a", "b"))
        assert moved == reqs and "pipe" not in server.endpoints
        assert list(b.requests.values()) == [reqs[0], reqs[2], reqs[4]]
        assert list(a.requests.values()) == [busy, reqs[1], reqs[3]]
        assert list(other.requests.values()) == [reqs[5]] and not server.queue  # no room
        # No member live (a failure): back to the queue head, routed as before.
        pipe2 = Taking("pipe2")
        server.endpoints["pipe2"] = pipe2
        late = server.new_request([1], SamplingParams())
        pipe2.requests[late.req_id] = late
        await server.retire("pipe2", spread_over=("gone",))
        assert late.req_id in other.requests
        server._pump.cancel()

    asyncio.run(run())
