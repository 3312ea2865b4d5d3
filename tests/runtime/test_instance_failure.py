"""An engine step that raises on a node agent fails that instance's requests with the
reason (a `RequestFailed` event, then `ServeRequest.fail` in the controller) instead of
killing the instance's loop and leaving every request on it waiting forever; the instance
then serves the next request. (A fuzzed temperature near 0 once did exactly that.)"""

import asyncio
from dataclasses import dataclass, field

from surge.engine.llm_engine import TokenEvent
from surge.engine.sampling import SamplingParams
from surge.runtime.agent_instances import AgentInstances, LocalInstance
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.protocol import Event, RequestFailed, TokenGenerated
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


@dataclass
class Ctx:
    events: list[Event] = field(default_factory=list)
    node: int = 3

    async def emit(self, ev: Event) -> None:
        self.events.append(ev)


def test_a_failing_step_fails_its_requests_and_the_instance_serves_on() -> None:
    async def run() -> tuple[Ctx, FlakyEngine]:
        ctx, engine = Ctx(), FlakyEngine({0: 1, 1: 1})
        agent = AgentInstances(ctx, None, None)  # type: ignore[arg-type]  # loop uses ctx only
        inst = LocalInstance("inst", "m", engine)  # type: ignore[arg-type]
        inst.requests.update({0: "r0", 1: "r1"})
        task = asyncio.create_task(agent._instance_loop(inst))
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


def test_the_controller_fails_the_request_with_the_agents_reason() -> None:
    ep = LocalEndpoint(None, 3, "m", "inst")  # type: ignore[arg-type]  # no calls made
    req = ServeRequest("r0", [1, 2], SamplingParams())
    ep.requests["r0"] = req
    ep.on_failed(RequestFailed(node=3, t=1.0, instance="inst", req_id="r0", error="boom"))
    assert req.done.is_set() and req.finish_reason == "error" and req.error == "boom"
    assert "r0" not in ep.requests
