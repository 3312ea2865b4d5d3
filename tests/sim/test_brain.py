"""The simulator carries out the policy's start-up, loading and ParaServe decisions."""

from dataclasses import replace

import numpy as np
import pytest

from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.sim.flows import FlowNetwork
from surge.sim.instance import Instance
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation, simulate
from surge.traces.request import make_trace


def _record_flows(monkeypatch) -> list[tuple[float, tuple[str, ...], float]]:
    flows: list[tuple[float, tuple[str, ...], float]] = []
    start = FlowNetwork.start

    def record(net, path, size, on_done):
        flows.append((net.loop.now_s, tuple(link.name for link in path), size))
        return start(net, path, size, on_done)

    monkeypatch.setattr(FlowNetwork, "start", record)
    return flows


def _burst(n: int = 200):
    return make_trace("burst", np.zeros(n), [512] * n, [16] * n)


def test_scale_out_from_a_host_copy_multicasts_at_once_without_a_leader_load(monkeypatch):
    flows = _record_flows(monkeypatch)
    sim = Simulation(_burst(), SimSettings("lambdascale-testbed1", ("llama2-13b",), "lambdascale"))
    res = sim.run()
    assert np.all(res.done_s > 0)
    first = res.scale_events[0]
    assert first[2] == "scale-out" and first[3] > 2
    t0 = first[0]
    host = sim.cache.machines_with(0)[0]
    at_once = [f for f in flows if f[0] == t0]
    # Blocks leave the host copy's machine NIC at t0: a multicast from host memory.
    from_host = [f for f in at_once if f[1][0] == f"nic-out/{host}"]
    assert from_host, "no block left host memory at the scale-out"
    assert all(f[2] < sim.world.models[0].profile.total_bytes for f in from_host)  # blocks
    # The destination on the host-copy machine loads its own GPU over PCIe meanwhile; no
    # GPU sends anything at t0 (no leader loads first and multicasts later).
    assert any(f[1] == (f"pcie/{host}",) for f in at_once)
    assert not [f for f in flows if f[0] <= t0 and f[1][0].startswith(("gnic-out", "intra"))]
    assert res.network_loads == first[3] - 1


def test_cold_start_leader_stages_the_model_in_host_memory_then_leads(monkeypatch):
    flows = _record_flows(monkeypatch)
    system = replace(system_config("lambdascale"), host_cache="lru", name="ls-cold")
    settings = SimSettings("lambdascale-testbed1", ("llama2-13b",), "lambdascale")
    res = simulate(_burst(), settings, system=system)
    assert np.all(res.done_s > 0)
    t0 = res.scale_events[0][0]
    staged = [f for f in flows if f[0] == t0]
    assert len(staged) == 1 and staged[0][1][0].startswith("ssd/")  # store -> host only
    leader = staged[0][1][0].split("/")[1]
    later = [f for f in flows if f[0] > t0 and f[1][0] == f"nic-out/{leader}"]
    assert later, "the cold leader's host copy never sourced the multicast"
    assert res.cache_misses == 1 and res.network_loads > 0


def test_k_grows_with_copies_gpu_and_host():
    # 2 warm instances (GPU copies) + the pinned host copy: a later scale-out has K > 1.
    trace = make_trace("late", np.r_[np.zeros(8), np.full(400, 5.0)], [512] * 408, [64] * 408)
    settings = SimSettings("lambdascale-testbed1", ("llama2-13b",), "lambdascale", warm_instances=2)
    sim = Simulation(trace, settings)
    seen: list[int] = []
    from surge.sim import multicast_load

    plan = multicast_load._plan

    def spy(request):
        seen.append(request.num_sources)
        return plan(request)

    multicast_load._plan = spy
    try:
        res = sim.run()
    finally:
        multicast_load._plan = plan
    assert np.all(res.done_s > 0)
    assert seen and max(seen) > 1


def test_paraserve_consolidation_frees_the_other_members_gpus():
    one = make_trace("one", [0.0], [1024], [16])
    system = replace(system_config("paraserve"), group_sizing="fixed")
    settings = SimSettings("paraserve-1", ("llama2-7b",), "paraserve", slo=Slo(100.0, 1.0))
    res = simulate(one, settings, system=system)
    assert res.first_token_s[0] > 0
    counts = [n for _, n in res.gpu_changes]
    assert max(counts) == 4  # the group fetched in parallel on 4 GPUs
    (when,) = [t for t, _, kind, _ in res.scale_events if kind == "consolidate"]
    after = [n for t, n in res.gpu_changes if t == when]
    assert after[-1] == 1  # scale-down (one request, empty window): one worker stays
    assert res.gpu_changes[-1][1] == 0  # then the autoscaler releases it


def test_paraserve_alg1_sizes_the_group_by_the_slo():
    one = make_trace("one", [0.0], [1024], [16])
    sizes = {}
    for ttft in (100.0, 3.0):
        settings = SimSettings("paraserve-1", ("llama2-7b",), "paraserve", slo=Slo(ttft, 1.0))
        res = simulate(one, settings)
        sizes[ttft] = max(n for _, n in res.gpu_changes)
    assert sizes[100.0] == 1 and sizes[3.0] > 1  # a tight SLO buys a parallel fetch


def test_every_instance_field_is_declared():
    assert not hasattr(Instance, "__dict__") or "__slots__" in vars(Instance)
    inst = Instance.__new__(Instance)
    with pytest.raises(AttributeError):
        inst.members = ()  # type: ignore[attr-defined]
    for name in ("lambdascale", "blitzscale", "paraserve", "flexpipe", "serverlessllm"):
        cluster = "blitzscale-b" if name == "blitzscale" else "lambdascale-testbed1"
        settings = SimSettings(cluster, ("llama2-7b",), name)
        res = simulate(_burst(100), settings)  # would raise on an undeclared attribute
        assert np.all(res.done_s > 0), name


def test_block_count_elbow_is_used_when_asked():
    settings = SimSettings(
        "lambdascale-testbed1", ("llama2-13b",), "lambdascale", block_count="elbow",
        block_overhead_s=0.002,
    )  # fmt: skip
    sim = Simulation(_burst(), settings)
    res = sim.run()
    assert np.all(res.done_s > 0)
    assert sim._elbows and all(1 <= b <= 40 for b in sim._elbows.values())


def test_flexpipe_refactors_when_the_arrivals_turn_bursty():
    from surge.traces.gamma import gamma_trace
    from surge.traces.request import Trace

    a = gamma_trace(10.0, 0.2, 60.0, 1, input_tokens=512, output_tokens=64)
    b = gamma_trace(10.0, 6.0, 60.0, 2, input_tokens=512, output_tokens=64)
    trace = Trace(
        "steady-then-bursty",
        np.r_[a.arrival_s, b.arrival_s + 60.0],
        np.r_[a.input_tokens, b.input_tokens],
        np.r_[a.output_tokens, b.output_tokens],
    )
    sim = Simulation(trace, SimSettings("lambdascale-testbed1", ("llama2-13b",), "flexpipe"))
    res = sim.run()
    assert np.all(res.done_s > 0)
    first = next(t for t, _, kind, _ in res.scale_events if kind == "scale-out")
    refactors = [t for t, _, kind, _ in res.scale_events if kind == "refactor"]
    assert refactors and min(refactors) > 60.0  # the steady minute kept its stages
    assert sim.flexpipe.spans  # groups were shaped by the policy
    # The first group started on one GPU (steady: coarse), the bursty phase split stages.
    assert [n for t, n in res.gpu_changes if t == first][-1] == 1
    assert max(len(s) for s in sim.flexpipe.spans.values()) > 1
