"""A request an agent keeps refusing (a bad field) fails with the agent's reason instead of
being routed again forever (defect 1: the request held its slot and hung)."""

import asyncio

from surge.engine.sampling import SamplingParams
from surge.runtime.endpoints import MAX_REFUSALS, LocalEndpoint
from surge.runtime.request import ServeRequest
from surge.runtime.transport import RemoteError


class RefusingClient:
    def __init__(self) -> None:
        self.calls = 0

    async def call(self, node, op):
        self.calls += 1
        raise RemoteError("instance_submit: seed must be between ...")


def test_a_refused_request_fails_after_a_few_tries() -> None:
    async def run():
        client = RefusingClient()
        ep = LocalEndpoint(client, 0, "m", "m@0")  # type: ignore[arg-type]
        req = ServeRequest("r0", [1, 2], SamplingParams())
        raised = 0
        for _ in range(MAX_REFUSALS):  # what Server.dispatch does: route again on a raise
            try:
                await ep.submit(req)
            except RemoteError:
                raised += 1
        await asyncio.wait_for(req.done.wait(), 1)
        return client, ep, req, raised

    client, ep, req, raised = asyncio.run(run())
    assert raised == MAX_REFUSALS - 1 and client.calls == MAX_REFUSALS
    assert req.finish_reason == "error" and "seed" in (req.error or "")
    assert ep.requests == {}


def test_the_agent_refuses_an_out_of_range_seed_when_it_decodes_the_op() -> None:
    import pytest

    from surge.errors import SurgeError
    from surge.runtime.protocol import InstanceSubmitOp, Op

    op = InstanceSubmitOp(instance="i", req_id="r", prompt_token_ids=(1,)).to_json()
    op["params"]["seed"] = 2**64
    with pytest.raises(SurgeError, match="seed"):
        Op.decode(op)
