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
