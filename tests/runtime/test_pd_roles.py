"""P/D roles of instances that join at once (a scale-out's destinations open together):
each counts the others, so 1:1 targets give one prefill and one decode instance."""

import asyncio
from types import SimpleNamespace
from typing import Any

from surge.policy.blitzscale.pd import DECODE, PREFILL, PdTargets
from surge.runtime.clock import REAL_CLOCK
from surge.runtime.migration.pd_handoff import PdServing
from surge.runtime.protocol import Ack, InstanceRoleOp


class SlowAgents:
    """Answers `instance_role` after a pause, as a real agent over a socket does."""

    def __init__(self) -> None:
        self.told: dict[str, str] = {}

    async def call(self, node: int, op: Any) -> Ack:
        assert isinstance(op, InstanceRoleOp)
        await asyncio.sleep(0.01)
        self.told[op.instance] = op.role
        return Ack()


def test_instances_joining_at_once_split_into_prefill_and_decode() -> None:
    agents = SlowAgents()
    server = SimpleNamespace(client=agents, endpoints={}, queue=[], clock=REAL_CLOCK)
    pd = PdServing(server, PdTargets(prefill=1, decode=1), 1024)  # type: ignore[arg-type]
    eps = [SimpleNamespace(node=n, name=f"m-node{n}", failed=False, capacity=4) for n in (0, 1)]

    async def run() -> None:
        await asyncio.gather(*(pd.assign(ep) for ep in eps))  # type: ignore[arg-type]

    asyncio.run(run())
    assert sorted(pd.roles.values()) == [DECODE, PREFILL]
    assert agents.told == pd.roles
