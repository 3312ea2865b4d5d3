"""P/D hand-offs in parallel (BlitzScale §3 Fig. 8a): one in flight per (source, target)
pair, pairs at once, the target's slot reserved while the K/V is in flight. The agents are
stand-ins that record, in order, when each K/V transfer starts and ends, so overlap is read
from the events, not from wall time."""

import asyncio
from collections.abc import Callable
from typing import Any

from surge.engine.sampling import SamplingParams
from surge.policy.blitzscale.pd import DECODE, PREFILL, PdTargets
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.pd_handoff import PdServing
from surge.runtime.protocol import (
    HANDOFF_REASON,
    Ack,
    HandoffReply,
    InstanceAdoptOp,
    InstanceHandoffOp,
    KvPart,
    TokenGenerated,
)
from surge.runtime.server import Server

MODEL = "m"
GATE_S = 1.0
"""How long a transfer waits for `overlap` transfers to be in flight before it goes on
alone (bounds the test on code that sends one at a time)."""


class KvAgents:
    """Stand-in agents: `instance_handoff` sends a parked K/V (held open until `overlap`
    transfers are in flight, or `GATE_S`), `instance_adopt` takes one. `events` records
    ("send", instance, req_id), ("sent", ...) and ("adopt", ...) in the order they happen."""

    def __init__(self, overlap: int) -> None:
        self.overlap = overlap
        self.events: list[tuple[str, str, str]] = []
        self.in_flight = 0
        self.changed = asyncio.Condition()
        self.on_overlap: Callable[[], None] = lambda: None
        """Called once `overlap` transfers are in flight."""
        self.adopt_paces: list[float] = []
        """How each adopt's K/V payload was paced (`ClusterClient.call_bytes`)."""

    def subscribe(self, event_types: tuple, model: str | None = None) -> asyncio.Queue:
        return asyncio.Queue()

    def unsubscribe(self, q: asyncio.Queue) -> None:
        pass

    async def call(self, node: int, op: Any) -> Ack:
        return Ack()

    async def call_bytes(
        self, node: int, op: Any, payload: bytes = b"", pace: float = 1.0
    ) -> tuple[Any, bytes]:
        if isinstance(op, InstanceAdoptOp):
            self.events.append(("adopt", op.instance, op.req_id))
            self.adopt_paces.append(pace)
            return Ack(), b""
        assert isinstance(op, InstanceHandoffOp)
        self.events.append(("send", op.instance, op.req_id))
        async with self.changed:
            self.in_flight += 1
            self.changed.notify_all()
            try:
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: self.in_flight >= self.overlap), GATE_S
                )
                self.on_overlap()
            except TimeoutError:
                pass
            self.in_flight -= 1
        self.events.append(("sent", op.instance, op.req_id))
        part = KvPart(first_layer=0, end_layer=2, shape=(2, 2, 4, 1, 8))
        return HandoffReply(part=part, output_token_ids=(7,), num_cached=5), b"kv"


def peak_transfers(events: list[tuple[str, str, str]]) -> int:
    """Most K/V transfers in flight at once, from the order of the events."""
    now = peak = 0
    for kind, _, _ in events:
        now += {"send": 1, "sent": -1}.get(kind, 0)
        peak = max(peak, now)
    return peak


async def _deployment(
    agents: KvAgents, roles: dict[str, str], decode_capacity: int = 8, kv_pace: float = 1.0
):
    server = Server(agents, MODEL)  # type: ignore[arg-type]
    pd = PdServing(server, PdTargets(1, 1), 1024, kv_pace=kv_pace)
    server.pd = pd
    eps = {}
    for node, (name, role) in enumerate(roles.items()):
        cap = decode_capacity if role == DECODE else 8
        eps[name] = LocalEndpoint(agents, node, MODEL, name, capacity=cap)  # type: ignore[arg-type]
        server.endpoints[name] = eps[name]
        pd.roles[name] = role
    return server, pd, eps


def _token(
    instance: str, req_id: str, token: int, reason: str, finished: bool = False
) -> TokenGenerated:
    return TokenGenerated(
        node=0,
        t=0.0,
        instance=instance,
        req_id=req_id,
        token=token,
        finished=finished,
        finish_reason=reason,
    )


def _park(server: Server, pd: PdServing, ep: LocalEndpoint) -> str:
    """A request prefilled on `ep`, parked there: its first token says so."""
    req = server.new_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=4))
    ep.requests[req.req_id] = req
    req.add_token(7, False, None)
    pd.on_token(ep, _token(ep.name, req.req_id, 7, HANDOFF_REASON))
    return req.req_id


async def _settle(pd: PdServing, agents: KvAgents, adopted: int) -> None:
    async def done() -> None:
        while sum(e[0] == "adopt" for e in agents.events) < adopted:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(done(), 10)


def test_handoffs_between_different_pairs_overlap() -> None:
    async def run() -> tuple[list, dict[str, str], list]:
        agents = KvAgents(overlap=2)
        roles = {"p0": PREFILL, "p1": PREFILL, "d0": DECODE, "d1": DECODE}
        server, pd, eps = await _deployment(agents, roles)
        egress: list[dict[int, int]] = []
        agents.on_overlap = lambda: egress.append(pd.egress_handoffs())
        try:
            ids = {_park(server, pd, eps["p0"]): "p0", _park(server, pd, eps["p1"]): "p1"}
            await _settle(pd, agents, 2)
            where = {rid: server.requests[rid].endpoint for rid in ids}
            egress.append(pd.egress_handoffs())
            return agents.events, where, egress
        finally:
            await server.close()

    events, where, egress = asyncio.run(run())
    # Both K/V transfers were in flight before either ended (one drainer sends one, then
    # the other), and each went to its own decode instance (the least loaded with room).
    assert peak_transfers(events) == 2, events
    assert sorted(where.values()) == ["d0", "d1"], where
    # The multicast planner sees both sources' egress busy while their K/V leaves them
    # (nodes 0 and 1), and neither once it has landed.
    assert egress[0] == {0: 1, 1: 1} and egress[-1] == {}, egress


def test_one_handoff_at_a_time_per_pair() -> None:
    async def run() -> list:
        agents = KvAgents(overlap=2)
        server, pd, eps = await _deployment(agents, {"p0": PREFILL, "d0": DECODE})
        try:
            _park(server, pd, eps["p0"])
            _park(server, pd, eps["p0"])
            await _settle(pd, agents, 2)
            assert pd.peak_in_flight == 1
            assert set(eps["d0"].requests) == set(server.requests)
            return agents.events
        finally:
            await server.close()

    events = asyncio.run(run())
    assert peak_transfers(events) == 1, events  # the second waited for the pair
    assert [e[0] for e in events] == ["send", "sent", "adopt"] * 2


def test_a_handoff_in_flight_holds_its_targets_last_slot() -> None:
    """One decode slot, two prefill instances each with a parked request: only one K/V
    may travel to it; the other waits until the slot frees (a request finishes there),
    though neither request is on the decode instance while its K/V is in flight."""

    async def run() -> tuple[list, list]:
        agents = KvAgents(overlap=2)
        roles = {"p0": PREFILL, "p1": PREFILL, "d0": DECODE}
        server, pd, eps = await _deployment(agents, roles, decode_capacity=1)
        try:
            first = _park(server, pd, eps["p0"])
            _park(server, pd, eps["p1"])
            await _settle(pd, agents, 1)
            await asyncio.sleep(0.1)
            before = list(agents.events)
            # the first request finishes on d0: its slot frees, the second may go
            eps["d0"].requests.pop(first)
            server.requests[first].add_token(8, True, "length")
            pd.on_token(eps["d0"], _token("d0", first, 8, "length", finished=True))
            await _settle(pd, agents, 2)
            return before, agents.events
        finally:
            await server.close()

    before, events = asyncio.run(run())
    assert [e[0] for e in before] == ["send", "sent", "adopt"], before
    assert peak_transfers(events) == 1, events
    assert [e[0] for e in events] == ["send", "sent", "adopt"] * 2


def test_the_controller_sends_handed_off_kv_at_its_kv_pace() -> None:
    """Under GPU-time emulation the K/V the controller relays to the decode agent is paced
    as K/V (`PdServing.kv_pace`, `control/emulation.kv_pace`), not as weight bytes."""

    async def run() -> list[float]:
        agents = KvAgents(overlap=1)
        server, pd, eps = await _deployment(agents, {"p0": PREFILL, "d0": DECODE}, kv_pace=0.06)
        try:
            _park(server, pd, eps["p0"])
            await _settle(pd, agents, 1)
            return agents.adopt_paces
        finally:
            await server.close()

    assert asyncio.run(run()) == [0.06]


def test_a_handoff_leaving_a_full_prefill_instance_routes_the_queue() -> None:
    """A prefill instance full with one parked request, another request queued at the
    router: the hand-off takes the parked one off the prefill instance, and the queued one
    goes there at once (the simulator's `Requests.drain`), not at the next arrival or
    finished request (none comes here). The stand-in agents' `call` records the submit."""

    async def run() -> tuple[list[str], str | None]:
        agents = KvAgents(overlap=1)
        submitted: list[str] = []

        async def call(node: int, op: Any) -> Ack:
            submitted.append(op.req_id)
            return Ack()

        agents.call = call  # type: ignore[method-assign]
        server, pd, eps = await _deployment(agents, {"p0": PREFILL, "d0": DECODE})
        eps["p0"].capacity = 1
        try:
            queued = server.new_request([1, 2, 3], SamplingParams(max_tokens=4))
            server.queue.append(queued)  # arrived while p0 was full
            _park(server, pd, eps["p0"])
            await _settle(pd, agents, 1)
            for _ in range(100):
                if submitted:
                    break
                await asyncio.sleep(0.01)
            return submitted, queued.endpoint
        finally:
            await server.close()

    submitted, endpoint = asyncio.run(run())
    assert len(submitted) == 1 and endpoint == "p0", (submitted, endpoint)
