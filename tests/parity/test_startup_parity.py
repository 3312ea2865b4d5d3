"""Start-up parity: the same cluster (which node holds a GPU copy, a host copy, a disk copy;
which nodes are new) asked of each body gives the same `policy.startup` plan — the same
local loads, multicast sources in the same order, receivers and cold leader.

`surge serve` asks through `control/scaleouts.startup_request` (agents are nodes), the
simulator through `sim/loading.Loader.startup_request` (instances on machines, host copies
named `HOST_NODE + machine`); ids are mapped to machines before comparing."""

from dataclasses import dataclass

import pytest

from surge.control.pool import ParameterPool
from surge.control.scaleouts import startup_request as runtime_request
from surge.policy.startup import LocalLoad, Source, StartupPlan, plan_startup
from surge.policy.systems import system_config
from surge.sim.multicast_load import ChainTail
from surge.sim.world import HOST_NODE
from tests.parity.sim_world import add_host_copy, entry_pool, instance_on, simulation

NUM_MACHINES = 5
NUM_BLOCKS = 4


@dataclass(frozen=True)
class Scenario:
    system: str
    gpu: tuple[int, ...]
    """Machines serving an instance (a GPU copy)."""
    host: tuple[int, ...]
    """Machines holding the model in host memory."""
    new: tuple[int, ...]
    """Machines of the new instances."""
    store: str = "registry"
    """`ssd`: every machine holds a disk copy."""
    sending: tuple[int, ...] = ()
    """Machines whose serving instance is a source of one multicast now."""
    loading: tuple[int, ...] = ()
    """Machines whose instance receives a multicast now (a chain tail)."""
    host_sending: tuple[int, ...] = ()
    """Machines whose host copy is a source of one multicast now."""


SCENARIOS = {
    "hot and warm: one source per machine, GPU first": Scenario(
        "lambdascale", gpu=(0,), host=(0, 1), new=(2, 3, 4)
    ),
    "warm only, 0 -> N from a host copy": Scenario("lambdascale", (), host=(1,), new=(2, 3)),
    "warm-local destination feeds the rest": Scenario("lambdascale", (), host=(2,), new=(2, 3)),
    "cold, a disk holder leads": Scenario("lambdascale", (), (), new=(3, 1), store="ssd"),
    "cold from the registry": Scenario("lambdascale", (), (), new=(4, 2)),
    "blitzscale sends from instances": Scenario("blitzscale", gpu=(0,), host=(1, 2), new=(2, 3)),
    "serverlessllm loads locally": Scenario("serverlessllm", gpu=(0,), host=(2,), new=(2, 3)),
    "a sending instance after the host copy (blitzscale)": Scenario(
        "blitzscale", gpu=(0,), host=(1,), new=(2, 3), sending=(0,)
    ),
    "a chain tail before a sending instance (blitzscale)": Scenario(
        "blitzscale", gpu=(0,), host=(), new=(2, 3), sending=(0,), loading=(1,)
    ),
    "a host copy beside a sending instance waits (blitzscale)": Scenario(
        "blitzscale", gpu=(0,), host=(0,), new=(2, 3), sending=(0,), loading=(1,)
    ),
    "a sending host copy after a chain tail (blitzscale)": Scenario(
        "blitzscale", gpu=(), host=(0,), new=(2, 3), host_sending=(0,), loading=(1,)
    ),
    "a chain tail is not a source for lambdascale": Scenario(
        "lambdascale", gpu=(0,), host=(), new=(2, 3), loading=(1,)
    ),
}


def _runtime_plan(s: Scenario) -> StartupPlan:
    pool = ParameterPool()
    pool.add_model("m", NUM_BLOCKS)
    blocks = list(range(NUM_BLOCKS))
    for n in s.gpu:
        pool.add("m", n, "gpu", blocks)
    for n in s.host:
        pool.add("m", n, "host", blocks)
    if s.store == "ssd":
        for n in range(NUM_MACHINES):
            pool.add("m", n, "disk", blocks)
    live = set(range(NUM_MACHINES))
    system = system_config(s.system)
    sending = dict.fromkeys(s.sending, 1)
    request = runtime_request(
        system,
        pool,
        "m",
        list(s.new),
        {},
        live,
        sending=sending,
        loading=s.loading,
        host_sending=dict.fromkeys(s.host_sending, 1),
    )
    return plan_startup(request)


def _sim_plan(s: Scenario, tmp_path) -> StartupPlan:
    sim = simulation(tmp_path, system_config(s.system), NUM_MACHINES, s.store)
    for m in s.host:
        add_host_copy(sim, m)
    for m in s.host_sending:
        sim.loader.multicasts.host_sending[m] = 1
    machine_of: dict[int, int] = {}
    for m in s.gpu:
        inst = instance_on(sim, m, serving=True)
        inst.sending = int(m in s.sending)
        machine_of[inst.id] = m
    for m in s.loading:  # an instance receiving a multicast now
        inst = instance_on(sim, m, serving=False)
        entry_pool(sim).instances.append(inst)
        sim.loader.multicasts.inflight[inst.id] = ChainTail(NUM_BLOCKS)
        machine_of[inst.id] = m
    new = [instance_on(sim, m, serving=False) for m in s.new]
    machine_of.update({i.id: m for i, m in zip(new, s.new, strict=True)})
    plan = plan_startup(sim.loader.startup_request(entry_pool(sim), new))

    def node(v: int) -> int:
        return v - HOST_NODE if v >= HOST_NODE else machine_of[v]

    return StartupPlan(
        plan.kind,
        tuple(LocalLoad(node(x.node), x.source) for x in plan.local),
        tuple(Source(node(x.node), x.tier) for x in plan.sources),
        tuple(node(v) for v in plan.receivers),
        None
        if plan.cold_leader is None
        else LocalLoad(node(plan.cold_leader.node), plan.cold_leader.source),
    )


@pytest.mark.parametrize("name", SCENARIOS)
def test_both_bodies_plan_the_same_start_up(name: str, tmp_path) -> None:
    s = SCENARIOS[name]
    runtime, sim = _runtime_plan(s), _sim_plan(s, tmp_path)
    assert runtime == sim, name
    # The scenarios reach the rules they are named for.
    if name.startswith("hot and warm"):
        assert runtime.sources == (Source(0, "gpu"), Source(1, "host"))
    if name.startswith("cold, a disk"):
        assert runtime.cold_leader == LocalLoad(3, "disk")  # placement order breaks the tie
    if name.startswith("blitzscale"):
        assert runtime.sources == (Source(0, "gpu"),) and runtime.local == ()
    if name.startswith("a sending instance"):
        # §5.1 Alg. 1: the copy with the most bandwidth left sends first (fails if the
        # runtime does not tell the policy which copies are sending).
        assert runtime.sources == (Source(1, "host"), Source(0, "gpu"))
    if name.startswith("a chain tail before"):
        # §5.1 Alg. 1 line 10: a receiver still loading forwards as blocks land, ahead of a
        # copy whose egress is held (fails if the runtime offers no chain tails).
        assert runtime.sources == (Source(1, "loading"), Source(0, "gpu"))
    if name.startswith(("a host copy beside", "a sending host copy")):
        # One NIC per machine (§5.1 Alg. 1's CurrentBW_s): the host copy of a machine that
        # sends already goes after a free chain tail (fails per copy, or if the runtime
        # does not count what host copies send).
        assert runtime.sources[0] == Source(1, "loading"), runtime.sources
    if name.startswith("a chain tail is not"):
        assert runtime.sources == (Source(0, "gpu"),)
    if name.startswith("serverlessllm"):
        assert runtime.sources == () and len(runtime.local) == 2
