"""P/D parity (BlitzScale §5.2, §6): the same deployment, described once, gets the same roles,
routes new requests to the same instances, hands a prefilled request to the same instance
(or keeps it waiting), and its monitor mutates the same instance and asks for the same
extra instance, in `surge serve` (`runtime/migration/pd_handoff.PdServing`, `control/pd.PdControl`)
and in the simulator (`sim/pd.PdPool` through `sim/pools.Requests` and
`sim/scaling.Scaler`).

Each body is built with the scenario's instances joining in order, each holding the
scenario's requests; what the body then *did* is recorded at its effects: the roles it
gave, the endpoints it lets new requests reach, the hand-off it started (the transport
stubbed), the role change it carried out and the instances it asked for. Instances are
named by join order in both."""

import asyncio
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from surge.config import EngineConfig
from surge.control.metrics import Metrics
from surge.control.pd import PdControl
from surge.policy.blitzscale.pd import PdTargets
from surge.policy.multicast.topology import NodeLinks
from surge.policy.systems import SystemConfig, system_config
from surge.runtime.clock import Clock
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.pd_handoff import PdServing
from surge.runtime.server import Server
from surge.sim.instance import Instance
from surge.sim.pools import Requests
from surge.sim.request import SimRequest
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import entry_pool, instance_on, simulation

SYSTEM = system_config("blitzscale")
BASELINE = replace(system_config("serverlessllm"), pd_disaggregation=True)
"""A system that does not mutate, P/D-disaggregated as BlitzScale §6.1 runs its baselines (in
`surge serve`: its deployment's `pd:`)."""
CAPACITY = 4
NOW_S = 100.0
LINK_GBPS = 100.0
"""Each node's reported ingress cap in `surge serve` (the simulator's hand-offs count
seconds of their target's link directly)."""


@dataclass(frozen=True)
class Case:
    """A P/D deployment at one instant."""

    held: tuple[int, ...]
    """Requests on each instance, in join order (roles: `role_for_new`'s)."""
    parked_on: int
    """The instance that has just prefilled one more request (its hand-off)."""
    waiting: int = 0
    """Requests at the router when the monitor looks."""
    system: SystemConfig = SYSTEM
    fed_s: tuple[float, ...] = ()
    """Seconds of each instance's ingress link that the hand-offs to it took within the
    monitor's window (BlitzScale §5.2's K/V incast), as each body counts them."""
    loading: int = 0
    """Instances still loading (placed, not serving): they join at the end."""
    roles: tuple[str, ...] = ()
    """Roles the serving instances hold now, if not the ones they joined with (prefill
    instances mutated or released before)."""
    release: tuple[int, ...] = ()
    """Instances the autoscaler would release (join order): what each body lets go."""


TARGETS = PdTargets(prefill=1, decode=2)
"""Roles as instances join: prefill, decode, decode, then prefill (blitzscale mutates: decode
grows by mutation past the targets)."""

CASES = {
    # P, D, D, P: equal decode instances, the oldest adopts; then decode is busy and the
    # youngest idle prefill instance mutates
    "handoff-then-mutate": Case((0, 3, 3, 0), parked_on=0),
    # one prefill instance alone: it decodes its own request
    "source-decodes": Case((2,), parked_on=0),
    # one prefill instance serving, the decode instance beside it still loading (a P/D pool
    # from zero, `serving_floor`): the request waits, and goes to it once it joins (§2.1)
    "decode-loading": Case((2,), parked_on=0, loading=1),
    # P, D, D, P: the least-loaded decode instance adopts; nothing to mutate
    "least-loaded": Case((0, 3, 1, 1), parked_on=3),
    # every decode instance full: the request waits; the idle young prefill instance
    # mutates, and the waiting request goes to it
    "decode-full": Case((0, 4, 4, 0), parked_on=0),
    # P, D, D, P: decode instances holding one request each, but K/V handed to i2 filled
    # 1.6 s of its link within the 2-s window: decode is the bottleneck, i3 mutates
    "ingress-bound": Case((0, 1, 1, 0), parked_on=0, fed_s=(0.0, 0.0, 1.6, 0.0)),
    # P, D, D, P: decode half full (below the monitor's threshold), prefill nearly idle:
    # the monitor does nothing, but a scale-out's new instance would decode by load, so
    # the idle prefill instance i3 mutates at once and the new one will prefill (§5.2)
    "scale-out-for-decode": Case((1, 2, 2, 0), parked_on=0),
    # one full prefill instance, requests waiting: the monitor wants one more
    "prefill-full": Case((4,), parked_on=0, waiting=3),
    # a system that does not mutate, past its targets: P, D, D, then the busier role
    # (decode, 3/4 full) -- the targets' ratio alone would make i3 a prefill instance
    "baseline-decode-busy": Case((0, 3, 3, 0), parked_on=0, system=BASELINE),
    # decode instances alone, one instance loading (it will prefill): new requests wait
    # at the router for it (§2.1, §6.1)
    "decode-only-prefill-loading": Case((1, 1), parked_on=0, loading=1, roles=("decode", "decode")),
    # decode instances alone, none coming: every instance takes requests (a way in), and
    # the monitor asks for a prefill instance since requests wait
    "decode-only": Case((1, 1), parked_on=0, roles=("decode", "decode"), waiting=2),
    # P, D, D, P, the autoscaler releasing both idle decode instances and the idle prefill
    # one: the prefill instance holding a request stays, so the youngest decode one does
    # too (`pd_release.releasable`, §4)
    "release-keeps-a-decode-instance": Case(
        (1, 0, 0, 0), parked_on=0, system=BASELINE, release=(1, 2, 3)
    ),
}


@dataclass
class Log:
    roles: list[str]
    routable: list[int]
    handoffs: list[tuple[int, int]]
    """(source, target) of the hand-offs started when the request was prefilled."""
    handoffs_after_look: list[tuple[int, int]]
    """... and those the monitor's look set going (a mutation made room)."""
    wants: int
    roles_after: list[str]
    roles_after_scale_out: list[str]
    """... and after the autoscaler then started one instance (§5.2's mutation at a
    scale-out, `policy.blitzscale.pd_mutation.scale_out_mutations`)."""
    handoffs_after_join: list[tuple[int, int]]
    """... and those started once the loading instances joined (their roles appended)."""
    released: list[int]
    """Of the case's `release`, the instances the body lets go."""


def _runtime(case: Case) -> Log:
    class Client(FakeClient):
        async def call(self, node, op):
            return None

    async def run() -> Log:
        server = Server(Client(), "m", clock=Clock(monotonic=lambda: NOW_S))  # type: ignore[arg-type]
        links = {k: NodeLinks(ingress_gbps=LINK_GBPS) for k in range(len(case.held))}
        control = PdControl(Metrics(), EngineConfig(), links=links)
        spec = SimpleNamespace(strategy=case.system.name, system=case.system, pd=TARGETS)
        slots = {k: None for k in range(len(case.held) + case.loading)}  # node -> its slot
        dep = SimpleNamespace(name="m", spec=spec, server=server, manifest=None, instances=slots)
        pd = control.attach(dep)  # type: ignore[arg-type]
        assert isinstance(pd, PdServing)
        eps = []
        for k, held in enumerate(case.held):
            ep = LocalEndpoint(server.client, k, "m", f"i{k}", capacity=CAPACITY)
            await server.add_endpoint(ep)
            for r in range(held):
                held_req = SimpleNamespace(prompt_token_ids=[1], output_token_ids=[])
                ep.requests[f"i{k}r{r}"] = held_req
            eps.append(ep)
        for ep, role in zip(eps, case.roles, strict=False):
            pd.roles[ep.name] = role  # mutated or released before
        roles = [pd.roles[e.name] for e in eps]
        released = list(pd.releasable(case.release))  # nodes are join order here
        for ep, fed_s in zip(eps, case.fed_s or (0.0,) * len(eps), strict=True):
            if fed_s:  # a hand-off's K/V payload went to `ep` (`PdServing.handoff`)
                pd.received(None, ep, round(fed_s * LINK_GBPS * 1e9 / 8))
        routable = sorted(eps.index(e) for e in pd.routable(dict(enumerate(eps))).values())
        done: list[tuple[int, int]] = []

        async def handoff(src, req, target) -> None:  # the transport stubbed
            assert req.req_id not in src.requests  # taken off its source as it starts
            target.requests[req.req_id] = req
            done.append((eps.index(src), eps.index(target)))

        pd.handoff = handoff  # type: ignore[method-assign]
        src = eps[case.parked_on]
        req = SimpleNamespace(req_id="parked", prompt_token_ids=[1], output_token_ids=[])
        src.requests[req.req_id] = req
        pd.pending.append((src, req))  # as `on_token` parks it after its prefill
        pd.kick()  # the hand-offs that may go start as tasks
        for _ in range(2):  # each runs, then its end frees its pair and reservation
            await asyncio.sleep(0)
        first = list(done)
        server.queue.extend(SimpleNamespace() for _ in range(case.waiting))
        wants = await control.tick(dep, NOW_S)  # type: ignore[arg-type]
        for _ in range(2):  # the hand-off a mutation let go, if any, and its end
            await asyncio.sleep(0)
        roles_after = [pd.roles[e.name] for e in eps]
        await control.on_scale_out(dep, NOW_S, 1)  # type: ignore[arg-type]
        scaled = [pd.roles[e.name] for e in eps]
        before = len(done)
        for k in range(len(case.held), len(case.held) + case.loading):
            ep = LocalEndpoint(server.client, k, "m", f"i{k}", capacity=CAPACITY)
            eps.append(ep)
            await server.add_endpoint(ep)  # it loaded: it joins
            for _ in range(2):
                await asyncio.sleep(0)
        scaled += [pd.roles[e.name] for e in eps[len(case.held) :]]
        after = done[before:]
        return Log(
            roles,
            routable,
            first,
            done[len(first) : before],
            wants,
            roles_after,
            scaled,
            after,
            released,
        )

    return asyncio.run(run())


def _sim(case: Case, tmp_path) -> Log:
    sim = simulation(tmp_path, case.system, len(case.held) + case.loading, "registry")
    pool = entry_pool(sim)
    assert pool.pd is not None
    pool.pd.targets = TARGETS  # the deployment's `pd:` (the runtime's spec above)
    insts: list[Instance] = []
    for k, held in enumerate(case.held):
        inst = instance_on(sim, k, serving=False)
        inst.max_batch = CAPACITY
        pool.instances.append(inst)
        sim.loader.ready(pool, inst)  # it serves: it joins
        for r in range(held):
            inst.submit(SimRequest(1000 * k + r, 0, 0.0, 1, 1), start=False)
        insts.append(inst)
    for k in range(len(case.held), len(case.held) + case.loading):
        inst = instance_on(sim, k, serving=False)  # placed, still loading
        inst.max_batch = CAPACITY
        pool.instances.append(inst)
    loading = pool.instances[len(case.held) :]
    for inst, role in zip(insts, case.roles, strict=False):
        inst.role = role  # mutated or released before
    roles = [i.role for i in insts]
    go = pool.pd.releasable(tuple(insts[k].id for k in case.release))
    released = [k for k, i in enumerate(insts) if i.id in go]
    sim.world.loop.now_s = NOW_S
    for inst, fed_s in zip(insts, case.fed_s or (0.0,) * len(insts), strict=True):
        if fed_s:  # a hand-off's K/V flow started to `inst` (`Requests._send_kv`)
            pool.pd.handed(inst, fed_s)
    routable = sorted(insts.index(e) for e in pool.endpoints())
    done: list[tuple[int, int]] = []
    patch = pytest.MonkeyPatch()

    def send_kv(self, pool, req, src, inst) -> None:  # the transport stubbed
        inst.reserved += 1
        done.append((insts.index(src), insts.index(inst)))

    def resume(self, req) -> None:
        self.submit(req, start=False)
        done.append((insts.index(self),) * 2)

    with patch.context() as mp:
        mp.setattr(Requests, "_send_kv", send_kv)
        mp.setattr(Instance, "resume", resume)
        sim.router.on_prefilled(insts[case.parked_on], SimRequest(-1, 0, 0.0, 1, 1))
        first = list(done)
        pool.queue.extend(SimRequest(-2 - r, 0, 0.0, 1, 1) for r in range(case.waiting))
        sim.world.loop.now_s = NOW_S
        wants = sim.scaler.pd_look(pool, NOW_S)
        roles_after = [i.role for i in insts]
        pool.pd.scale_out(NOW_S, len(pool.queue), 1)  # `Scaler._carry_out`'s call
        scaled = [i.role for i in insts]
        before = len(done)
        for inst in loading:
            insts.append(inst)
            sim.loader.ready(pool, inst)  # it loaded: it joins
        scaled += [i.role for i in loading]
    after = done[before:]
    handed = done[len(first) : before]
    return Log(roles, routable, first, handed, wants, roles_after, scaled, after, released)


@pytest.mark.parametrize("name", list(CASES))
def test_both_bodies_take_the_same_pd_actions(name: str, tmp_path) -> None:
    case = CASES[name]
    runtime, sim = _runtime(case), _sim(case, tmp_path)
    assert runtime == sim


def test_the_cases_exercise_every_decision(tmp_path) -> None:
    """The scenarios are not vacuous: between them, each decision takes each branch."""
    logs = {}
    for n, c in CASES.items():
        (tmp_path / n).mkdir()
        logs[n] = _sim(c, tmp_path / n)
    p, d = "prefill", "decode"
    assert logs["handoff-then-mutate"].roles == [p, d, d, p]
    assert logs["handoff-then-mutate"].handoffs == [(0, 1)]
    assert logs["source-decodes"].handoffs == [(0, 0)]
    assert logs["source-decodes"].wants == 1  # no decode instance (§4): one is asked for
    assert logs["decode-loading"].handoffs == []  # waits for the loading decode instance
    assert logs["decode-loading"].roles_after_scale_out == [p, d]
    assert logs["decode-loading"].handoffs_after_join == [(0, 1)]
    assert logs["least-loaded"].handoffs == [(3, 2)]
    assert logs["decode-full"].handoffs == []
    assert logs["decode-full"].handoffs_after_look == [(0, 3)]
    assert logs["handoff-then-mutate"].roles_after == [p, d, d, d]
    assert logs["ingress-bound"].roles_after == [p, d, d, d]  # by ingress alone
    assert logs["decode-full"].roles_after == [p, d, d, d]
    assert logs["least-loaded"].roles_after == logs["least-loaded"].roles
    assert logs["prefill-full"].wants == 1
    assert logs["handoff-then-mutate"].wants == 1  # the prefill instance that compensates
    scaled = logs["scale-out-for-decode"]
    assert scaled.roles_after == scaled.roles == [p, d, d, p]  # the monitor does nothing
    assert scaled.roles_after_scale_out == [p, d, d, d]  # the scale-out mutates i3
    assert logs["baseline-decode-busy"].roles_after_scale_out == [p, d, d, d]  # no mutation
    assert logs["handoff-then-mutate"].routable == [0, 3]
    assert logs["baseline-decode-busy"].roles == [p, d, d, d]
    assert logs["baseline-decode-busy"].routable == [0]
    assert logs["decode-only-prefill-loading"].routable == []  # they wait for the prefill one
    assert logs["decode-only-prefill-loading"].roles_after_scale_out == [d, d, p]
    assert logs["decode-only"].routable == [0, 1]
    assert logs["decode-only"].wants == 1  # a prefill instance, for the requests waiting
    assert logs["release-keeps-a-decode-instance"].released == [1, 3]
