"""An engine step that raises on a node agent fails that instance's requests with the
reason (a `RequestFailed` event, then `ServeRequest.fail` in the controller) instead of
killing the instance's loop and leaving every request on it waiting forever; the instance
then serves the next request. (A fuzzed temperature near 0 once did exactly that.)"""

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from surge.engine.llm_engine import TokenEvent
from surge.engine.sampling import SamplingParams
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.node.instance_loop import run_instance
from surge.runtime.node.instances import AgentInstances
from surge.runtime.node.local_instance import LocalInstance
from surge.runtime.protocol import Event, InstanceSubmitOp, RequestFailed, TokenGenerated
from surge.runtime.request import ServeRequest


@dataclass
class FlakyEngine:
    """Raises on its first step, then finishes whatever it holds with one token each."""

    seqs: dict[int, int] = field(default_factory=dict)
    steps: int = 0
    aborted: list[int] = field(default_factory=list)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    def step(self) -> list[TokenEvent]:
        self.steps += 1
        if self.steps == 1:
            raise RuntimeError("invalid multinomial distribution")
        out = [TokenEvent(sid, 7, True, "length") for sid in self.seqs]
        self.seqs.clear()
        return out

    def abort(self, sid: int) -> None:
        self.aborted.append(sid)
        self.seqs.pop(sid)

    def release(self, sid: int) -> None:
        self.seqs.pop(sid, None)

    def check_prompt(self, prompt: list[int]) -> None:
        return None

    def add_request(self, prompt: list[int], params: SamplingParams, out: list[int]) -> int:
        raise RuntimeError("no room for it")


@dataclass
class Ctx:
    events: list[Event] = field(default_factory=list)
    node: int = 3
    pacer: None = None
    """Not emulated: steps take what they take."""

    async def emit(self, ev: Event) -> None:
        self.events.append(ev)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(coro)


def test_a_failing_step_fails_its_requests_and_the_instance_serves_on() -> None:
    async def run() -> tuple[Ctx, FlakyEngine]:
        ctx, engine = Ctx(), FlakyEngine({0: 1, 1: 1})
        inst = LocalInstance("inst", "m", engine)  # type: ignore[arg-type]
        inst.requests.update({0: "r0", 1: "r1"})
        task = asyncio.create_task(run_instance(ctx, inst))
        for _ in range(100):  # the two failures, then idle
            await asyncio.sleep(0.01)
            if len(ctx.events) == 2:
                break
        engine.seqs[2] = 1  # the next request is served
        inst.requests[2] = "r2"
        inst.wake.set()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(ctx.events) == 3:
                break
        task.cancel()
        return ctx, engine

    ctx, engine = asyncio.run(run())
    failed = [e for e in ctx.events if isinstance(e, RequestFailed)]
    assert sorted(e.req_id for e in failed) == ["r0", "r1"], ctx.events
    assert all("invalid multinomial" in e.error and e.model == "m" for e in failed)
    assert sorted(engine.aborted) == [0, 1]
    (served,) = [e for e in ctx.events if isinstance(e, TokenGenerated)]
    assert served.req_id == "r2" and served.finished


def test_a_submitted_request_the_loop_cannot_add_is_failed_at_the_controller() -> None:
    """The agent answers a submit at once and adds the request at the next step boundary;
    an add that raises there used to set an exception on a future nobody awaited, and the
    request waited forever. Now the controller hears a `RequestFailed` with the reason."""

    async def run() -> Ctx:
        ctx, engine = Ctx(), FlakyEngine()
        agent = AgentInstances(ctx, None, None)  # type: ignore[arg-type]  # ops use ctx only
        inst = LocalInstance("inst", "m", engine)  # type: ignore[arg-type]
        agent.instances["inst"] = inst
        task = asyncio.create_task(run_instance(ctx, inst))
        op = InstanceSubmitOp(instance="inst", req_id="r9", prompt_token_ids=(1, 2))
        await agent.op_instance_submit(op, None, memoryview(b""))  # type: ignore[arg-type]
        for _ in range(100):
            await asyncio.sleep(0.01)
            if ctx.events:
                break
        task.cancel()
        return ctx

    ctx = asyncio.run(run())
    (failed,) = ctx.events
    assert isinstance(failed, RequestFailed) and failed.req_id == "r9", ctx.events
    assert "no room for it" in failed.error and failed.model == "m"


def test_the_controller_fails_the_request_with_the_agents_reason() -> None:
    ep = LocalEndpoint(None, 3, "m", "inst")  # type: ignore[arg-type]  # no calls made
    req = ServeRequest("r0", [1, 2], SamplingParams())
    ep.requests["r0"] = req
    ep.on_failed(RequestFailed(node=3, t=1.0, instance="inst", req_id="r0", error="boom"))
    assert req.done.is_set() and req.finish_reason == "error" and req.error == "boom"
    assert "r0" not in ep.requests


def test_a_dead_endpoint_does_not_starve_the_event_pump() -> None:
    """An endpoint whose agent just died fails its submit at once, without awaiting: the
    dispatcher must yield between retries, so the pump can process `agent_down` and retire
    it (in CI a tight retry loop once hung a P/D kill test until its timeout)."""
    from surge.runtime.client import ClusterClient
    from surge.runtime.endpoints import Endpoint
    from surge.runtime.protocol import AgentDown
    from surge.runtime.server import Server
    from surge.runtime.transport import ConnectionClosed

    class Dead(Endpoint):
        def __init__(self, name: str, node: int) -> None:
            self.name, self.nodes, self.requests = name, (node,), {}
            self.tries = 0

        async def submit(self, req: ServeRequest) -> None:
            self.tries += 1
            raise ConnectionClosed("peer closed")  # no await: fails at once

        async def take_back(self) -> list[ServeRequest]:
            return list(self.requests.values())

    class Alive(Endpoint):
        def __init__(self, name: str, node: int) -> None:
            self.name, self.nodes, self.requests = name, (node,), {}

        async def submit(self, req: ServeRequest) -> None:
            self.requests[req.req_id] = req

    async def run() -> tuple[Dead, Alive, ServeRequest]:
        client = ClusterClient.__new__(ClusterClient)
        client._subs = []  # subscribe only
        server = Server(client, "m")
        dead, alive = Dead("dead", 0), Alive("alive", 1)
        server.endpoints = {"dead": dead, "alive": alive}  # the router prefers the oldest
        req = server.new_request([1, 2], SamplingParams())
        # the agent's death reaches the pump a moment later, as over the network
        asyncio.get_running_loop().call_later(
            0.05, server._events.put_nowait, AgentDown(node=0, t=0.0)
        )
        await asyncio.wait_for(server.submit(req), 5.0)
        server._pump.cancel()
        return dead, alive, req

    dead, alive, req = asyncio.run(run())
    assert req.req_id in alive.requests and dead.failed
    assert 1 <= dead.tries < 100, dead.tries  # retried with pauses, not spun


def test_a_request_taken_back_during_a_failing_submit_is_served_once() -> None:
    """The agent dies while a submit to it is out: the pump retires its endpoint (taking
    the request back into the queue) before the submit fails. The dispatcher must not
    queue it a second time — twice queued, it went to two instances, and every token came
    back twice (a P/D kill test in CI ended with 59 tokens of 30)."""
    from surge.runtime.client import ClusterClient
    from surge.runtime.endpoints import Endpoint
    from surge.runtime.protocol import AgentDown
    from surge.runtime.server import Server
    from surge.runtime.transport import ConnectionClosed

    class Dying(Endpoint):
        """Holds the request while its call is out; the call fails after the agent_down."""

        def __init__(self, name: str, node: int, down: asyncio.Event) -> None:
            self.name, self.nodes, self.requests, self.down = name, (node,), {}, down

        async def submit(self, req: ServeRequest) -> None:
            self.requests[req.req_id] = req
            await self.down.wait()  # the pump retires this endpoint meanwhile
            await asyncio.sleep(0.01)
            raise ConnectionClosed("peer closed")

        async def take_back(self) -> list[ServeRequest]:
            taken = list(self.requests.values())
            self.requests.clear()
            self.down.set()
            return taken

    class Alive(Endpoint):
        def __init__(self, name: str, node: int) -> None:
            self.name, self.nodes, self.requests = name, (node,), {}
            self.submitted: list[str] = []

        async def submit(self, req: ServeRequest) -> None:
            self.submitted.append(req.req_id)
            self.requests[req.req_id] = req

    async def run() -> tuple[Server, Alive]:
        client = ClusterClient.__new__(ClusterClient)
        client._subs = []  # subscribe only
        server = Server(client, "m")
        dying, alive = Dying("dying", 0, asyncio.Event()), Alive("alive", 1)
        server.endpoints = {"dying": dying, "alive": alive}  # the router prefers the oldest
        req = server.new_request([1, 2], SamplingParams())
        asyncio.get_running_loop().call_later(
            0.05, server._events.put_nowait, AgentDown(node=0, t=0.0)
        )
        await asyncio.wait_for(server.submit(req), 5.0)
        for _ in range(50):  # every dispatcher has run
            await asyncio.sleep(0.01)
        server._pump.cancel()
        return server, alive

    server, alive = asyncio.run(run())
    assert alive.submitted == ["r0"], alive.submitted  # once, not twice
    assert not server.queue
