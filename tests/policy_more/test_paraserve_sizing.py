"""ParaServe Alg. 1 (§4.1): Eq. 1/2/5 predictions and the (s, w, servers) choice vs brute force."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.errors import SurgeError
from surge.policy.paraserve.sizing import (
    GpuServer,
    SizingRequest,
    SizingSettings,
    StageTimes,
    partition_bytes,
    predict_tpot_s,
    predict_ttft_s,
    select_parallelism,
)

GB = 1_000_000_000
TIMES = StageTimes(
    runtime_init_s=2.0,
    transmission_s=0.01,
    prefill_s=0.3,
    decode_s=0.03,
    wait_s=0.5,
    container_create_s=1.0,
    cuda_init_s=0.5,
    library_load_s=1.5,
)


def test_eq1_eq2_and_eq5_by_hand() -> None:
    # Two servers: 16 and 8 Gbit/s network, 64 Gbit/s PCIe; a 16 GB model in s = 2 parts,
    # one full-memory worker. Eq. 1 uses the slower server: 8 GB at 8 Gbit/s = 8 s fetch,
    # 8 GB at 64 Gbit/s = 1 s load.
    servers = (GpuServer(0, 40 * GB, 16.0, 64.0), GpuServer(1, 40 * GB, 8.0, 64.0))
    request = SizingRequest(16 * GB, servers, TIMES, ttft_slo_s=100.0, tpot_slo_s=1.0)
    slowdown = 2 - 1 + 1 / 2
    assert predict_ttft_s(request, 2, 1, servers) == pytest.approx(
        0.5 + 2.0 + 8.0 + 1.0 + 0.3 * slowdown + 0.01 * 2
    )
    assert predict_tpot_s(TIMES, 2, 1) == pytest.approx(0.03 * slowdown + 0.01 * 2)
    # Eq. 5: max over servers of max(t_cc + t_cu + max(load, t_l), fetch) = max(3, 8) = 8.
    overlapped = SizingRequest(
        16 * GB, servers, TIMES, 100.0, 1.0, SizingSettings(overlap_startup=True)
    )
    assert predict_ttft_s(overlapped, 2, 1, servers) == pytest.approx(
        0.5 + 8.0 + 0.3 * slowdown + 0.01 * 2
    )


def test_tight_ttft_needs_a_pipeline_and_tight_tpot_full_memory_workers() -> None:
    # ParaServe's testbed: A10 servers with 16 Gbit/s. A 13 GB model alone fetches in 6.5 s.
    servers = tuple(GpuServer(i, 24 * GB, 16.0, 100.0) for i in range(4))
    relaxed = select_parallelism(SizingRequest(13 * GB, servers, TIMES, 30.0, 1.0))
    assert relaxed is not None and relaxed.pipeline_size == 1 and relaxed.meets_slo
    tight = select_parallelism(SizingRequest(13 * GB, servers, TIMES, 6.5, 1.0))
    assert tight is not None and tight.meets_slo and tight.pipeline_size > 1
    assert tight.num_full_memory_workers == 0  # a loose TPOT needs no extra memory
    slowdown_1 = predict_tpot_s(TIMES, tight.pipeline_size, 0)
    tpot_tight = select_parallelism(SizingRequest(13 * GB, servers, TIMES, 6.5, slowdown_1 - 1e-3))
    assert tpot_tight is not None and tpot_tight.meets_slo
    assert (tpot_tight.pipeline_size, tpot_tight.num_full_memory_workers) > (
        tight.pipeline_size,
        0,
    )


def test_falls_back_to_one_full_worker_and_gives_up_without_memory() -> None:
    servers = (GpuServer(0, 20 * GB, 1.0, 10.0), GpuServer(1, 20 * GB, 4.0, 10.0))
    fallback = select_parallelism(SizingRequest(13 * GB, servers, TIMES, 0.1, 0.001))
    assert fallback is not None and not fallback.meets_slo
    assert (fallback.pipeline_size, fallback.full_memory_servers) == (1, (1,))  # the faster
    small = (GpuServer(0, 5 * GB, 16.0, 10.0),)
    assert select_parallelism(SizingRequest(13 * GB, small, TIMES, 0.1, 0.001)) is None
    # No GPU holds 13 GB, but three 5 GB parts fit: the smallest such group starts it.
    three = tuple(GpuServer(i, 5 * GB, 16.0, 10.0) for i in range(4))
    group = select_parallelism(SizingRequest(13 * GB, three, TIMES, 0.1, 0.001))
    assert group is not None and not group.meets_slo
    assert (group.pipeline_size, group.num_full_memory_workers) == (3, 0)


def test_servers_refusing_workers_are_never_chosen() -> None:
    servers = (GpuServer(0, 40 * GB, 0.0, 100.0), GpuServer(1, 40 * GB, 1.0, 100.0))
    decision = select_parallelism(SizingRequest(13 * GB, servers, TIMES, 1e9, 1e9))
    assert decision is not None and decision.servers == (1,)


def test_bad_requests_are_user_errors() -> None:
    server = (GpuServer(0, GB, 1.0, 1.0),)
    with pytest.raises(SurgeError):
        SizingRequest(0, server, TIMES, 1.0, 1.0)
    with pytest.raises(SurgeError):
        SizingRequest(GB, server * 2, TIMES, 1.0, 1.0)
    with pytest.raises(SurgeError):
        SizingRequest(GB, (GpuServer(0, GB, 1.0, 0.0),), TIMES, 1.0, 1.0)
    with pytest.raises(SurgeError):
        StageTimes(-1.0, 0, 0, 0, 0)


def brute_force(request: SizingRequest) -> dict[tuple[int, int], float]:
    """For every (s, w) with some valid server assignment: the smallest predicted TTFT over
    all assignments whose TPOT and TTFT meet the SLOs (absent if none does)."""
    best: dict[tuple[int, int], float] = {}
    m = request.model_bytes
    usable = [s for s in request.servers if s.network_gbps > 0]
    for size in range(1, request.settings.max_pipeline_size + 1):
        part = partition_bytes(m, size)
        for num_full in range(size + 1):
            if predict_tpot_s(request.times, size, num_full) > request.tpot_slo_s:
                continue
            for group in itertools.permutations(usable, size):
                full, low = group[:num_full], group[num_full:]
                if any(s.free_memory_bytes < m for s in full) or any(
                    s.free_memory_bytes < part for s in low
                ):
                    continue
                ttft = predict_ttft_s(request, size, num_full, group)
                if ttft <= request.ttft_slo_s:
                    best[(size, num_full)] = min(best.get((size, num_full), math.inf), ttft)
    return best


SERVER = st.builds(
    lambda mem, net, pcie: (mem * GB, net, pcie),
    st.sampled_from([2, 4, 8, 16, 24]),
    st.sampled_from([0.0, 4.0, 10.0, 16.0, 25.0, 100.0]),
    st.sampled_from([16.0, 64.0, 128.0]),
)


@settings(max_examples=150, deadline=None)
@given(
    raw=st.lists(SERVER, min_size=1, max_size=6),
    model_gb=st.sampled_from([3, 7, 13]),
    ttft_slo_s=st.floats(1.0, 20.0),
    tpot_slo_s=st.floats(0.02, 0.2),
    overlap=st.booleans(),
)
def test_choice_is_the_smallest_feasible_s_then_w_with_the_fastest_servers(
    raw: list[tuple[int, float, float]],
    model_gb: int,
    ttft_slo_s: float,
    tpot_slo_s: float,
    overlap: bool,
) -> None:
    servers = tuple(GpuServer(i, *r) for i, r in enumerate(raw))
    request = SizingRequest(
        model_gb * GB,
        servers,
        TIMES,
        ttft_slo_s,
        tpot_slo_s,
        SizingSettings(overlap_startup=overlap),
    )
    decision = select_parallelism(request)
    feasible = brute_force(request)
    if feasible:
        assert decision is not None and decision.meets_slo
        s_w = min(feasible)
        assert (decision.pipeline_size, decision.num_full_memory_workers) == s_w
        assert decision.ttft_s == pytest.approx(feasible[s_w])  # no assignment is faster
        by_id = {s.server_id: s for s in servers}
        part = partition_bytes(request.model_bytes, decision.pipeline_size)
        assert len(set(decision.servers)) == decision.pipeline_size
        assert all(
            by_id[i].free_memory_bytes >= request.model_bytes for i in decision.full_memory_servers
        )
        assert all(by_id[i].free_memory_bytes >= part for i in decision.low_memory_servers)
    elif any(s.network_gbps > 0 and s.free_memory_bytes >= request.model_bytes for s in servers):
        assert decision is not None and not decision.meets_slo
        assert (decision.pipeline_size, decision.num_full_memory_workers) == (1, 1)
    elif decision is not None:  # no GPU holds the model: the smallest group whose parts fit
        assert not decision.meets_slo and decision.num_full_memory_workers == 0
        part = partition_bytes(request.model_bytes, decision.pipeline_size)
        fits = [s for s in servers if s.network_gbps > 0 and s.free_memory_bytes >= part]
        assert len(fits) >= decision.pipeline_size
        for smaller in range(1, decision.pipeline_size):
            part = partition_bytes(request.model_bytes, smaller)
            fit = [s for s in servers if s.network_gbps > 0 and s.free_memory_bytes >= part]
            assert len(fit) < smaller
    else:
        for size in range(1, SizingSettings().max_pipeline_size + 1):
            part = partition_bytes(request.model_bytes, size)
            fit = [s for s in servers if s.network_gbps > 0 and s.free_memory_bytes >= part]
            assert len(fit) < size
