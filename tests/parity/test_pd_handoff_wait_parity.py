"""P/D load parity (BlitzScale §5.2): which prefilled requests *wait for decode room*
(`PdLoad.num_handoffs_waiting`, the monitor's first sign that decode is the bottleneck).
The simulator starts a hand-off as soon as a decode instance has room: from then on it is
that instance's load (`reserved`) and no longer parked on its source (`sim/pd.py`
`next_handoff`); its `parked` holds only the requests no decode instance has room for. The
runtime sends one hand-off at a time per (source, target) pair (each over its own link,
BlitzScale §3 Fig. 8a), so a request may wait for its pair while its target has room: the
monitor must see it as that target's load, not as waiting for room
(`runtime/migration/pd_handoff.PdServing._booked`).

Before 2026-11-29 the runtime counted it as waiting: on the emulated §6.1 7B run a look at
4.30 s saw "1 prefilled requests wait for decode room" with both decode instances at 3 of 8,
mutated prefill instance node 3 and scaled out node 4, which the simulator does not.

The scenario: a prefill instance (i0) has prefilled `PREFILLED` requests; one decode
instance (i1) with room for them all. In the runtime the first hand-off is under way on the
pair (i0, i1) and the others wait for it."""

import asyncio
from types import SimpleNamespace

from surge.config import EngineConfig
from surge.policy.blitzscale.pd import DECODE, PREFILL, PdTargets
from surge.policy.systems import system_config
from surge.runtime.clock import Clock
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.pd_handoff import PdServing
from surge.runtime.server import Server
from surge.sim.instance import Instance
from surge.sim.pools import Requests
from surge.sim.request import SimRequest
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import entry_pool, instance_on, simulation

CAPACITY = 8
PREFILLED = 3
NOW_S = 100.0

View = tuple[int, tuple[int, ...], tuple[int, ...]]
"""Hand-offs waiting for decode room; each instance's requests and those parked on it."""


def _view(load) -> View:
    return (
        load.num_handoffs_waiting,
        tuple(i.outstanding for i in load.instances),
        tuple(i.parked for i in load.instances),
    )


class _Client(FakeClient):
    async def call(self, node, op) -> None:
        return None


def _runtime() -> View:
    async def run() -> View:
        server = Server(_Client(), "m", clock=Clock(monotonic=lambda: NOW_S))  # type: ignore[arg-type]
        pd = PdServing(server, PdTargets(1, 1), EngineConfig().max_kv_tokens)
        server.pd = pd
        eps = []
        for k, role in enumerate((PREFILL, DECODE)):
            ep = LocalEndpoint(server.client, k, "m", f"i{k}", capacity=CAPACITY)
            await server.add_endpoint(ep)
            pd.roles[ep.name] = role
            eps.append(ep)
        on_link = asyncio.Event()

        async def handoff(src, req, target) -> None:  # the first K/V on the pair's link
            await on_link.wait()

        pd.handoff = handoff  # type: ignore[method-assign]
        for r in range(PREFILLED):  # as `on_token` parks each after its prefill
            req = SimpleNamespace(req_id=f"r{r}", prompt_token_ids=[1], output_token_ids=[])
            eps[0].requests[req.req_id] = req
            pd.pending.append((eps[0], req))
            pd.kick()
        await asyncio.sleep(0)
        assert len(pd.pending) == PREFILLED - 1, "the others wait for the pair"
        view = _view(pd.load(NOW_S, float("inf")))
        on_link.set()
        await pd.close()
        return view

    return asyncio.run(run())


def _sim(tmp_path, monkeypatch) -> View:
    sim = simulation(tmp_path, system_config("blitzscale"), 2, "registry")
    pool = entry_pool(sim)
    assert pool.pd is not None
    pool.pd.targets = PdTargets(1, 1)
    insts: list[Instance] = []
    for k in range(2):
        inst = instance_on(sim, k, serving=False)
        inst.max_batch = CAPACITY
        pool.instances.append(inst)
        sim.loader.ready(pool, inst)  # it serves: it joins (prefill, then decode)
        insts.append(inst)
    assert [i.role for i in insts] == [PREFILL, DECODE]

    def send_kv(self, pool, req, src, inst) -> None:  # the transport stubbed
        inst.reserved += 1

    monkeypatch.setattr(Requests, "_send_kv", send_kv)
    for r in range(PREFILLED):
        sim.router.on_prefilled(insts[0], SimRequest(r, 0, 0.0, 1, 1))
    return _view(pool.pd.load(0))


def test_a_handoff_waiting_for_its_link_is_its_targets_load_not_waiting_for_room(
    tmp_path, monkeypatch
) -> None:
    sim = _sim(tmp_path, monkeypatch)
    assert sim == (0, (0, PREFILLED), (0, 0))
    assert _runtime() == sim
