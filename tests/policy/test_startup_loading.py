"""Start-up choices (λScale §5, FaaScale §5, ParaServe Alg. 1/2) and the serve-while-loading
state machine (λScale §4.3-4.4, BlitzScale live), as both bodies call them."""

from dataclasses import replace

import pytest

from surge.errors import SurgeError
from surge.policy.loading import (
    GoLocal,
    LoadingSettings,
    LoadingState,
    OpenPipeline,
    RetirePipeline,
    spread_evenly,
)
from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
from surge.policy.paraserve.group_plan import GroupRequest, plan_group, split_blocks
from surge.policy.paraserve.sizing import GpuServer, StageTimes
from surge.policy.startup import Copy, Destination, LocalLoad, Source, StartupRequest, plan_startup
from surge.policy.systems import system_config

LAMBDA = system_config("lambdascale")


def test_gpu_and_host_copies_are_both_sources_gpu_first_least_loaded() -> None:
    req = StartupRequest(
        LAMBDA,
        tuple(Destination(n) for n in (5, 6, 7)),
        (Copy(2, "host"), Copy(1, "gpu", outstanding=3), Copy(0, "gpu", outstanding=1)),
    )
    plan = plan_startup(req)
    assert plan.kind == "hot"
    assert plan.sources == (Source(0, "gpu"), Source(1, "gpu"), Source(2, "host"))
    assert plan.receivers == (5, 6, 7) and plan.local == () and plan.cold_leader is None
    assert plan.multicast_nodes == (0, 1, 2, 5, 6, 7)
    # Never more sources than receivers, nor than the system's max_sources.
    two = plan_startup(replace(req, destinations=(Destination(5), Destination(6))))
    assert [s.node for s in two.sources] == [0, 1]
    one = plan_startup(replace(req, system=replace(LAMBDA, max_sources=1)))
    assert one.sources == (Source(0, "gpu"),)


def test_zero_to_n_from_one_host_copy_multicasts_at_once() -> None:
    """FaaScale §5: a host copy is a multicast source by itself: no leader loads first."""
    plan = plan_startup(
        StartupRequest(LAMBDA, (Destination(1), Destination(2), Destination(3)), (Copy(0, "host"),))
    )
    assert plan.kind == "warm" and plan.cold_leader is None
    assert plan.sources == (Source(0, "host"),) and plan.receivers == (1, 2, 3)


def test_warm_local_destination_loads_itself_and_feeds_the_rest() -> None:
    plan = plan_startup(
        StartupRequest(LAMBDA, (Destination(1), Destination(2, "host"), Destination(3, "disk")))
    )
    assert plan.local == (LocalLoad(2, "host"),)
    assert plan.sources == (Source(2, "host"),) and plan.receivers == (1, 3)


def test_cold_start_leader_prefers_a_disk_copy_and_fallback_local() -> None:
    dests = (Destination(1), Destination(2, "disk"), Destination(3))
    plan = plan_startup(StartupRequest(LAMBDA, dests))
    assert plan.kind == "cold"
    assert plan.cold_leader == LocalLoad(2, "disk")
    assert LocalLoad(2, "host") in plan.local
    assert plan.sources == (Source(2, "host"),) and plan.receivers == (1, 3)
    faasnet = plan_startup(StartupRequest(system_config("faasnet"), dests))
    assert faasnet.sources == () and faasnet.cold_leader is None
    assert {(x.node, x.source) for x in faasnet.local} == {
        (1, "remote"),
        (2, "disk"),
        (3, "remote"),
    }
    sllm = plan_startup(StartupRequest(system_config("serverlessllm"), dests, (Copy(0, "gpu"),)))
    assert sllm.sources == () and len(sllm.local) == 3


def test_bad_startup_requests_are_refused() -> None:
    with pytest.raises(SurgeError):
        StartupRequest(LAMBDA, ())
    with pytest.raises(SurgeError):
        StartupRequest(LAMBDA, (Destination(1),), (Copy(1, "host"),))
    with pytest.raises(SurgeError):
        Destination(1, "ssd")


def test_split_blocks_balances_bytes_and_keeps_parts_non_empty() -> None:
    assert split_blocks((1, 1, 1, 1), 2) == ((0, 1), (2, 3))
    assert split_blocks((8, 1, 1, 1, 1, 1, 1, 1, 1), 2) == ((0,), (1, 2, 3, 4, 5, 6, 7, 8))
    assert split_blocks((1, 1, 1), 3) == ((0,), (1,), (2,))
    with pytest.raises(SurgeError):
        split_blocks((1, 1), 3)


def test_paraserve_group_is_sized_by_alg1_for_one_cold_start() -> None:
    gb = 1_000_000_000
    times = StageTimes(
        runtime_init_s=0.5, transmission_s=0.001, prefill_s=0.05, decode_s=0.02, wait_s=0.0
    )
    servers = tuple(GpuServer(n, 80 * gb, network_gbps=8.0, pcie_gbps=100.0) for n in range(4))
    blocks = tuple([gb] * 8)  # 8 GB: 8 s alone over 8 Gbit/s
    tight = plan_group(GroupRequest(blocks, servers, times, ttft_slo_s=3.0, tpot_slo_s=1.0))
    assert tight is not None and len(tight.members) == 4  # 8/3 s fetch + init > 3 s; 8/4 s fits
    assert tight.parts == ((0, 1), (2, 3), (4, 5), (6, 7))
    loose = plan_group(GroupRequest(blocks, servers, times, ttft_slo_s=60.0, tpot_slo_s=1.0))
    assert loose is not None and len(loose.members) == 1  # minimal parallelism


def _pipelines_state(mode: str = "pipelines") -> tuple[LoadingState, tuple]:
    outcome = plan_scale_out(MulticastRequest(num_nodes=6, num_blocks=4, num_sources=1))
    s = LoadingSettings(6, 4, 1, outcome.pipelines, mode)
    return LoadingState(s), outcome


def test_loading_opens_pipelines_then_mode_switches_in_plan_order() -> None:
    state, outcome = _pipelines_state()
    actions = []
    for step in outcome.plan.steps:
        for tr in step:
            actions += state.arrive(tr.dst, tr.block)
    opened = [a.index for a in actions if isinstance(a, OpenPipeline)]
    retired = [a.index for a in actions if isinstance(a, RetirePipeline)]
    assert opened and sorted(retired) == sorted(opened)  # every open pipeline retires
    locals_ = [a.node for a in actions if isinstance(a, GoLocal)]
    assert sorted(locals_) == [1, 2, 3, 4, 5]
    for i, a in enumerate(actions):  # a retirement follows its last member's GoLocal at once
        if isinstance(a, RetirePipeline):
            prior = [x.node for x in actions[:i] if isinstance(x, GoLocal)]
            assert prior[-1] in a.pipeline.nodes
            assert set(a.pipeline.nodes) <= set(prior)  # λScale §4.4: every member is whole
    assert state.arrive(1, 0) == ()  # duplicates change nothing


def test_a_pipeline_retires_only_once_every_member_holds_the_model() -> None:
    state, outcome = _pipelines_state()
    pipe = next(p for p in outcome.pipelines if len(p.nodes) >= 2)
    index = outcome.pipelines.index(pipe)
    for s in pipe.stages:  # the pipeline opens
        for blk in range(s.first_block, s.last_block + 1):
            state.arrive(s.node, blk)
    assert index in state.open
    first, *rest = pipe.nodes
    done = [a for blk in range(4) for a in state.arrive(first, blk)]
    assert GoLocal(first) in done and not any(isinstance(a, RetirePipeline) for a in done)
    assert index in state.open  # one member whole: the pipeline still serves
    for v in rest:
        done = [a for blk in range(4) for a in state.arrive(v, blk)]
    assert done[-1] == RetirePipeline(index, pipe) and index not in state.open


def test_spread_evenly_deals_requests_round_robin_over_the_members() -> None:
    assert spread_evenly(7, (0, 0, 0), (9, 9, 9)) == (0, 1, 2, 0, 1, 2, 0)
    counts = [spread_evenly(11, (0,) * 4, (64,) * 4).count(m) for m in range(4)]
    assert max(counts) - min(counts) <= 1 and sum(counts) == 11
    # a member already busy gets fewer; none past its capacity: the rest go to the queue
    assert spread_evenly(5, (2, 0), (3, 9)) == (1, 1, 0, 1, 1)
    assert spread_evenly(4, (1, 1), (2, 2)) == (0, 1, None, None)
    assert spread_evenly(0, (1,), (1,)) == ()
    with pytest.raises(SurgeError):
        spread_evenly(3, (), ())
    with pytest.raises(SurgeError):
        spread_evenly(3, (0, 0), (1,))
