"""A client that goes away during a long engine step must not hold up the next request.

An agent answers `instance_abort` only at its instance's next step boundary (it runs the
abort between two steps), and a node's control connection carries one exchange at a time
(`Connection.request` holds its lock; the agent serves one connection's ops in order). The
abort sent for a vanished client went on that connection, so every later op to the node —
the next request's `instance_submit` among them — waited for the running step: walked on
`surge serve` with SmolLM2, a client that gave up on an 8,000-token prompt left a new
streamed chat without even its response headers for 60 s (its keep-alives never started).
The abort now goes on a pooled connection of its own (`ClusterClient.call_bytes`)."""

import asyncio
from pathlib import Path

from surge.control.metrics import Metrics
from surge.control.requests import Requests
from surge.control.spec import DeploymentSpec
from surge.control.state import Deployment
from surge.engine.sampling import SamplingParams
from surge.model.manifest import read_manifest
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.protocol import AbortReply, Ack, InstanceAbortOp, Op, SubmitReply
from surge.runtime.server import Server

SUBMIT_WITHIN_S = 2.0


class AgentWithLongStep:
    """One node as the controller's client reaches it: `call` on the control connection
    (one exchange at a time), `call_bytes` on a pooled connection of its own; an abort is
    answered when the running step ends (`step_over`)."""

    def __init__(self) -> None:
        self.down: set[int] = set()
        self.control = asyncio.Lock()
        self.step_over = asyncio.Event()
        self.aborts = 0

    def subscribe(self, event_types, model=None) -> asyncio.Queue:
        return asyncio.Queue()

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        pass

    async def _answer(self, op: Op):
        if isinstance(op, InstanceAbortOp):
            self.aborts += 1
            await self.step_over.wait()
            return AbortReply(outputs={})
        return SubmitReply() if op.NAME == "instance_submit" else Ack()

    async def call(self, node: int, op: Op):
        async with self.control:
            return await self._answer(op)

    async def call_bytes(self, node: int, op: Op, payload=b"", pace: float = 1.0):
        return await self._answer(op), memoryview(b"")


async def _scenario(store: Path) -> None:
    agent = AgentWithLongStep()
    spec = DeploymentSpec.from_json({"name": "m", "model": str(store)})
    dep = Deployment(spec, read_manifest(store), None, Server(agent, "m"))  # type: ignore[arg-type]
    dep.server.endpoints["m-0"] = LocalEndpoint(agent, 0, "m", "m-0")  # type: ignore[arg-type]
    requests = Requests(agent, {"m": dep}, Metrics(), lambda: None)  # type: ignore[arg-type]
    params = SamplingParams(max_tokens=4)
    long = await requests.submit(dep, list(range(1, 1000)), params)
    requests.finished(long, "cancelled")  # its client went away mid-prefill
    await asyncio.sleep(0.05)
    assert agent.aborts == 1
    try:
        async with asyncio.timeout(SUBMIT_WITHIN_S):
            await requests.submit(dep, [1, 2, 3], params)
    finally:
        agent.step_over.set()
        await dep.server.close()


def test_an_abort_waiting_for_a_step_does_not_hold_up_the_next_submit(tiny_store: Path) -> None:
    asyncio.run(_scenario(tiny_store))
