"""ParaServe Alg. 2 (§4.2): Eq. 3 admission, Eq. 4 pending sizes, deadlines in a fluid model."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.errors import SurgeError
from surge.policy.paraserve.placement import (
    FetchingWorker,
    ServerNetwork,
    admit_worker,
    contention_adjusted_servers,
    fetch_deadline_s,
    finish_worker,
    handle_bandwidth_change,
    share_for_new_worker_gbps,
)
from surge.policy.paraserve.sizing import GpuServer

GBPS_8 = 8.0  # 8 Gbit/s = 1e9 bytes/s, so bytes read as nanoseconds of the full link
GB = 1e9


def test_eq4_advances_every_pending_size_by_an_equal_share() -> None:
    net = ServerNetwork(0, GBPS_8, (FetchingWorker("a", 100, 4 * GB), FetchingWorker("b", 100, GB)))
    later = handle_bandwidth_change(net, 1.0)  # two workers at 0.5 GB/s each for 1 s
    assert [w.pending_bytes for w in later.workers] == pytest.approx([3.5 * GB, 0.5 * GB])
    assert later.last_change_s == 1.0
    done = handle_bandwidth_change(later, 2.0)  # b reaches zero and leaves
    assert [w.worker_id for w in done.workers] == ["a"]
    assert done.workers[0].pending_bytes == pytest.approx(3.0 * GB)


def test_eq3_refuses_a_worker_that_would_make_another_miss_its_deadline() -> None:
    # "a" needs 4 GB by t = 5: alone it gets 1 GB/s (fine), with a second worker 0.5 GB/s.
    net = ServerNetwork(0, GBPS_8, (FetchingWorker("a", 5.0, 4 * GB),))
    assert share_for_new_worker_gbps(net, 0.0) == 0.0
    assert admit_worker(net, FetchingWorker("b", 50.0, GB), 0.0) is None
    # At t = 3 "a" has 1 GB left and 2 s to go: half the link is enough.
    assert share_for_new_worker_gbps(net, 3.0) == pytest.approx(GBPS_8 / 2)
    admitted = admit_worker(net, FetchingWorker("b", 50.0, GB), 3.0)
    assert admitted is not None
    assert [w.pending_bytes for w in admitted.workers] == pytest.approx([GB, GB])


def test_every_bandwidth_change_updates_pending_sizes() -> None:
    net = ServerNetwork(0, GBPS_8, (FetchingWorker("a", 100, 10 * GB),))
    net = admit_worker(net, FetchingWorker("b", 100, 10 * GB), 2.0)  # a fetched 2 GB alone
    assert net is not None
    assert [w.pending_bytes for w in net.workers] == pytest.approx([8 * GB, 10 * GB])
    net = finish_worker(net, "b", 4.0)  # 2 s at half the link each
    assert [(w.worker_id, w.pending_bytes) for w in net.workers] == [("a", pytest.approx(7 * GB))]
    assert net.last_change_s == 4.0


def test_sizing_sees_the_share_a_new_worker_would_get() -> None:
    servers = (GpuServer(0, 10, 8.0, 10.0), GpuServer(1, 10, 8.0, 10.0), GpuServer(2, 10, 8, 10))
    networks = {
        0: ServerNetwork(0, 8.0, (FetchingWorker("x", 100.0, GB),)),
        1: ServerNetwork(1, 8.0, (FetchingWorker("y", 0.5, GB),)),
    }
    shares = [s.network_gbps for s in contention_adjusted_servers(servers, networks, 0.0)]
    assert shares == [4.0, 0.0, 8]


def test_deadline_is_the_latest_fetch_end_within_the_slo() -> None:
    # Predicted TTFT 6 s of which 4 s fetching, SLO 8 s: the fetch may end at now + 6.
    assert fetch_deadline_s(10.0, 8.0, 6.0, 4.0) == pytest.approx(16.0)


def test_bad_states_are_user_errors() -> None:
    with pytest.raises(SurgeError):
        ServerNetwork(0, 0.0)
    with pytest.raises(SurgeError):
        ServerNetwork(0, 1.0, (FetchingWorker("a", 1, 1), FetchingWorker("a", 1, 1)))
    with pytest.raises(SurgeError):
        handle_bandwidth_change(ServerNetwork(0, 1.0, last_change_s=5.0), 4.0)


def fluid_completion_times(arrivals: list[tuple[float, float]], rate: float) -> list[float]:
    """Processor sharing: workers (arrival time, bytes) share `rate` equally while active."""
    remaining = {i: size for i, (_, size) in enumerate(arrivals)}
    done: dict[int, float] = {}
    now, next_arrival = 0.0, 0
    active: set[int] = set()
    while len(done) < len(arrivals):
        t_arrive = arrivals[next_arrival][0] if next_arrival < len(arrivals) else float("inf")
        if active:
            share = rate / len(active)
            first = min(active, key=lambda i: remaining[i])
            t_finish = now + remaining[first] / share
        else:
            t_finish = float("inf")
        t_next = min(t_arrive, t_finish)
        if active:
            for i in active:
                remaining[i] -= share * (t_next - now)
        now = t_next
        if t_finish <= t_arrive:
            active.discard(first)
            done[first] = now
        else:
            active.add(next_arrival)
            next_arrival += 1
    return [done[i] for i in range(len(arrivals))]


@settings(max_examples=80, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.floats(0.0, 3.0), st.floats(0.1, 4.0), st.floats(0.5, 10.0)),
        min_size=1,
        max_size=10,
    )
)
def test_admitted_workers_all_finish_by_their_deadlines(
    requests: list[tuple[float, float, float]],
) -> None:
    # Workers arrive (gap, GB to fetch, time budget); one is admitted when Eq. 3 holds for
    # the others and it can itself finish at the offered share (sizing's job).
    net = ServerNetwork(0, GBPS_8)
    now = 0.0
    admitted: list[tuple[float, float, float]] = []  # (arrival, bytes, deadline)
    for i, (gap, size_gb, budget_s) in enumerate(requests):
        now += gap
        share_gbps = share_for_new_worker_gbps(net, now)
        if share_gbps == 0 or size_gb * GB > share_gbps / 8 * GB * budget_s:
            continue
        worker = FetchingWorker(str(i), now + budget_s, size_gb * GB)
        placed = admit_worker(net, worker, now)
        assert placed is not None  # GETNODEBANDWIDTH and admission agree
        net = placed
        admitted.append((now, size_gb * GB, now + budget_s))
    finish = fluid_completion_times([(a, b) for a, b, _ in admitted], GBPS_8 / 8 * GB)
    for (_, _, deadline), end in zip(admitted, finish, strict=True):
        assert end <= deadline + 1e-6


def test_cold_starts_record_their_workers_and_steer_later_ones_away() -> None:
    from surge.policy.paraserve.placement import place_cold_start
    from surge.policy.paraserve.sizing import SizingRequest, StageTimes

    times = StageTimes(
        runtime_init_s=0.5, transmission_s=0.0, prefill_s=0.1, decode_s=0.01, wait_s=0.0
    )
    servers = tuple(GpuServer(i, 40 * 10**9, 8.0, 100.0) for i in range(4))
    networks = {i: ServerNetwork(i, 8.0) for i in range(4)}
    # 8 GB alone takes 8 s at 1 GB/s; a 5 s TTFT SLO needs a pipeline.
    request = SizingRequest(8 * 10**9, servers, times, ttft_slo_s=5.0, tpot_slo_s=1.0)
    first, networks = place_cold_start(request, networks, "m1", 0.0)
    assert first is not None and first.meets_slo and first.pipeline_size >= 2
    busy = set(first.servers)
    for i in busy:
        (worker,) = networks[i].workers
        assert worker.worker_id == f"m1/{i}"
        assert worker.pending_bytes == pytest.approx(8e9 / first.pipeline_size)
        assert worker.deadline_s <= 5.0
    # A second model right away: sharing a busy server would halve the first's bandwidth
    # and break its deadline, so it goes to the idle servers.
    second, networks = place_cold_start(request, networks, "m2", 0.0)
    assert second is not None and second.meets_slo
    assert not busy & set(second.servers)
    # A third finds every server refusing: no placement rather than a broken deadline.
    third, after = place_cold_start(request, networks, "m3", 0.0)
    assert third is None and after == networks
