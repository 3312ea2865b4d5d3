"""BlitzScale live-scaling decisions (§4, §5.2): the SLO check, the measured Time_l, the choice
between the zigzag ILP and best effort, which queued requests a live batch takes, and the
redistribution once the new instance is whole."""

import math
from dataclasses import replace

import pytest

from surge.errors import SurgeError
from surge.policy.blitzscale.live_pair import (
    LiveSource,
    Waiting,
    cooperating,
    pair_with,
    redirect_order,
    takes_from,
)
from surge.policy.blitzscale.live_scaling import (
    Decline,
    LiveScalingState,
    LiveSettings,
    LiveView,
    RunBatch,
    WaitForLayers,
    choose_schedule,
    layer_load_s,
    measured_load_ratio,
    redistributed,
)
from surge.policy.blitzscale.slo_check import (
    DRAIN_WINDOW_S,
    PrefillSpan,
    SloCheck,
    drain_rate_per_s,
    needs_live_scaling,
    predicted_ttfts,
    prefill_s_per_token,
)
from surge.policy.blitzscale.zigzag import ZigzagProblem, best_effort, solve_zigzag


def test_prefill_time_counts_a_batched_step_once() -> None:
    # Two requests prefilled in one 0.1 s step, then one alone in 0.05 s.
    spans = [PrefillSpan(0.0, 0.1, 10), PrefillSpan(0.0, 0.1, 10), PrefillSpan(1.0, 1.05, 5)]
    assert prefill_s_per_token(spans) == pytest.approx(0.15 / 25)
    # Overlapping but not equal spans: their union.
    assert prefill_s_per_token([PrefillSpan(0, 2, 1), PrefillSpan(1, 3, 1)]) == pytest.approx(1.5)
    assert prefill_s_per_token([]) is None
    assert prefill_s_per_token([PrefillSpan(1.0, 1.0, 4)]) is None


def test_drain_rate_is_departures_in_the_window() -> None:
    now = 10.0
    departures = [now - DRAIN_WINDOW_S - 1, now - 1.5, now - 1.0, now - 0.5, now - 0.1]
    assert drain_rate_per_s(departures, now) == pytest.approx(4 / DRAIN_WINDOW_S)
    assert drain_rate_per_s([1.0], now) is None


def _check(slo_s: float, **kw) -> SloCheck:
    base = dict(
        now_s=10.0,
        queued_arrivals_s=(9.0, 9.5, 9.9),
        ttft_slo_s=slo_s,
        drain_per_s=2.0,
        prefill_s_per_request=0.1,
        num_serving=1,
    )
    return SloCheck(**{**base, **kw})


def test_predicted_ttft_is_waited_plus_queue_position_over_drain_plus_prefill() -> None:
    ttfts = predicted_ttfts(_check(1.0))
    expected = [(10.0 - a) + (k + 1) / 2.0 + 0.1 for k, a in enumerate((9.0, 9.5, 9.9))]
    assert ttfts == pytest.approx(expected)


def test_slo_check_gates_live_scaling() -> None:
    worst = max(predicted_ttfts(_check(1.0)))
    assert needs_live_scaling(_check(worst * 0.9)).live
    assert not needs_live_scaling(_check(worst * 1.1)).live
    assert needs_live_scaling(_check(worst * 1.1)).worst_ttft_s == pytest.approx(worst)
    # An empty queue never needs help.
    assert not needs_live_scaling(_check(0.01, queued_arrivals_s=())).live


def test_new_instance_whole_soon_drains_the_queue_faster() -> None:
    queue = tuple(9.0 + 0.01 * i for i in range(20))
    alone = predicted_ttfts(_check(1.0, queued_arrivals_s=queue))
    helped = predicted_ttfts(_check(1.0, queued_arrivals_s=queue, whole_in_s=1.0))
    # Requests leaving before it is whole see no change; later ones do.
    assert helped[0] == pytest.approx(alone[0])
    assert all(h <= a + 1e-12 for h, a in zip(helped, alone, strict=True))
    assert helped[-1] < alone[-1]


def test_unmeasured_drain_falls_back_to_compute_or_to_the_wait_so_far() -> None:
    compute = predicted_ttfts(_check(1.0, drain_per_s=None, num_serving=2))
    assert compute[-1] == pytest.approx(0.1 + 3 / (2 / 0.1) + 0.1)
    nothing = predicted_ttfts(_check(1.0, drain_per_s=None, prefill_s_per_request=None))
    assert nothing == pytest.approx((1.0, 0.5, 0.1))
    # A queue that does not drain at all misses any SLO.
    assert needs_live_scaling(_check(100.0, drain_per_s=0.0)).worst_ttft_s == math.inf


def test_slo_check_rejects_bad_settings() -> None:
    with pytest.raises(SurgeError):
        _check(0.0)
    with pytest.raises(SurgeError):
        _check(1.0, num_serving=-1)


def test_layer_load_time_from_block_arrivals() -> None:
    # Blocks of 2 layers landing every 0.4 s: 0.2 s per layer.
    arrivals = [(5.0, 2), (5.4, 2), (5.8, 2), (6.2, 1)]
    assert layer_load_s(arrivals) == pytest.approx(1.2 / 5)
    assert layer_load_s(arrivals[:1]) is None
    assert layer_load_s([(1.0, 2), (1.0, 2)]) is None


def test_load_ratio_is_measured_once_both_sides_are_known() -> None:
    fallback = measured_load_ratio(None, 0.001, 40, 8, fallback=1.0)
    assert not fallback.measured and fallback.value == 1.0
    assert not measured_load_ratio(0.2, None, 40, 8, fallback=3.0).measured
    # One layer of a 40-token batch: 0.001 s/token * 40 / 8 layers = 5 ms; loading 0.2 s.
    r = measured_load_ratio(0.2, 0.001, 40, 8, fallback=1.0)
    assert r.measured and r.layer_exec_s == pytest.approx(0.005)
    assert r.value == pytest.approx(0.2 / 0.005)


@pytest.mark.parametrize(
    "problem",
    [
        ZigzagProblem(num_layers=7, load_ratio=6.0, num_batches=6),  # Fig. 12
        ZigzagProblem(num_layers=8, load_ratio=0.5, num_batches=4, resident_layers_at_start=4),
        ZigzagProblem(num_layers=4, load_ratio=1.0, num_batches=1),
        ZigzagProblem(num_layers=16, load_ratio=2.0, num_batches=8, resident_layers_at_start=2),
    ],
)
def test_choice_is_the_ilp_only_when_it_beats_best_effort(problem: ZigzagProblem) -> None:
    chosen = choose_schedule(problem)
    be, zz = best_effort(problem), solve_zigzag(problem)
    assert chosen.avg_latency == pytest.approx(min(be.avg_latency, zz.avg_latency))
    assert chosen.policy == ("zigzag" if zz.avg_latency < be.avg_latency - 1e-9 else "best_effort")


def test_zigzag_when_layers_keep_coming_and_best_effort_for_one_batch() -> None:
    # Layers keep landing while 8 batches wait: delaying some on the source pays off.
    assert choose_schedule(ZigzagProblem(16, 2.0, 8, 2)).policy == "zigzag"
    # Fig. 12's own numbers (Time_l = 6, k0 = 1): C3 keeps every batch at (1, 6), a tie.
    assert choose_schedule(ZigzagProblem(7, 6.0, 6)).policy == "best_effort"
    # One batch: nothing to balance, the ILP cannot win.
    assert choose_schedule(ZigzagProblem(7, 6.0, 1)).policy == "best_effort"


def test_a_live_batch_takes_the_oldest_queued_requests_wherever_they_wait() -> None:
    """§4 step 1 ("we redirect all queued requests from inst.0"): requests queued on a
    source's engine are taken as the router's are, oldest first. The old rule took the
    router's queue only, so the source's two oldest waited for its next step."""
    settings = LiveSettings(num_layers=4, live_batch=3, fallback_load_ratio=2.0, ttft_slo_s=0.01)
    waiting = (
        Waiting(5.0, 10),  # the router's queue: arrived after those it routed
        Waiting(6.0, 10),
        Waiting(1.0, 10, source=0),  # routed to source 0, not started there
        Waiting(2.0, 10, source=0),
    )
    view = LiveView(now_s=100.0, held_layers=2, sources=(LiveSource(0, 4),), waiting=waiting)
    assert redirect_order(waiting) == (2, 3, 0, 1)
    action = LiveScalingState(settings).look(view)
    assert isinstance(action, RunBatch)
    assert action.take == (2, 3, 0) and action.num_requests == 3


def test_redistribution_sends_every_queued_request_back_oldest_first() -> None:
    """§5.2 step 3: every request queued (not started) on the instances the target helped
    goes back to the router, which spreads them; ties keep their order."""
    queued = (Waiting(3.0, 8, 0), Waiting(1.0, 8, 1), Waiting(3.0, 8, 1), Waiting(2.0, 8, 0))
    assert redistributed(queued) == (1, 3, 0, 2)
    assert redistributed(()) == ()


def _look_state() -> tuple[LiveScalingState, LiveView]:
    settings = LiveSettings(num_layers=4, live_batch=2, fallback_load_ratio=2.0, ttft_slo_s=0.01)
    waiting = tuple(Waiting(0.0, 10) for _ in range(12))
    view = LiveView(now_s=100.0, held_layers=1, sources=(LiveSource(0, 1),), waiting=waiting)
    return LiveScalingState(settings), view


def test_batches_overlap_up_to_max_in_flight_and_a_landing_layer_wakes_the_pending_one() -> None:
    """Fig. 12b: the next batch starts while one is under way (up to `max_in_flight`);
    §5.2 (2): a zigzag batch waiting for layer 2 is woken by the layer that brings it."""
    state, view = _look_state()
    first = state.look(view)
    assert isinstance(first, RunBatch) and first.schedule == "zigzag" and first.split == 1
    second = state.look(replace(view, in_flight=1))  # batch 1 under way: batch 2 starts
    assert isinstance(second, RunBatch) and second.index == 1
    assert state.look(replace(view, in_flight=2)) == Decline("busy")
    assert not state.wakes(1) and state.pending_layers is None
    assert state.look(replace(view, in_flight=1)) == WaitForLayers(2)  # batch 3: T = 2
    assert not state.wakes(1) and state.wakes(2)
    third = state.look(replace(view, held_layers=2))
    assert isinstance(third, RunBatch) and third.split == 2 and state.pending_layers is None
    with pytest.raises(SurgeError):
        LiveSettings(
            num_layers=4, live_batch=2, fallback_load_ratio=2.0, ttft_slo_s=1, max_in_flight=0
        )


def test_under_pd_only_prefill_instances_cooperate() -> None:
    """BlitzScale §5.2: the live pair is the overloaded instance and the new one, and under
    P/D live scaling scales a prefill instance ("prefill-only serving"), whose K/V goes to
    decode instances (§5.1 Fig. 11). A decode instance, however idle, runs no batch's last
    layers (it would prefill and decode: a P-D colocated instance, §5.2's future work).
    Before, the least-loaded source cooperated whatever its role (355 of 662 batches on
    §6.1's 7B run)."""
    settings = LiveSettings(num_layers=4, live_batch=2, fallback_load_ratio=2.0, ttft_slo_s=0.01)
    waiting = tuple(Waiting(0.0, 10) for _ in range(4))
    sources = (LiveSource(0, 5), LiveSource(1, 0, prefills=False))
    action = LiveScalingState(settings).look(LiveView(100.0, 2, sources, waiting))
    assert isinstance(action, RunBatch) and action.source == 0
    assert cooperating(sources) == (sources[0],)
    assert cooperating(sources, decode_partners=True) == sources  # the counterfactual
    decode_only = LiveView(100.0, 2, (LiveSource(1, 0, prefills=False),), waiting)
    assert LiveScalingState(settings).look(decode_only) == Decline("idle")


def test_a_target_pairs_with_the_overloaded_instance_and_takes_its_queue() -> None:
    """BlitzScale §5.2: "for each overloaded instance, we will identify an instance in the
    chain"; the pair's protocol, step (1): "we redirect all queued requests from inst.0 to
    it", and inst.0 runs the remaining layers (§4 Fig. 7 d). So the partner is the most
    loaded cooperating instance, kept while it cooperates, and the target takes its queue
    and the router's, not another instance's. Main before 2026-11-29 ran every batch on
    the least loaded one (source 1 here) and took source 1's queue."""
    settings = LiveSettings(num_layers=4, live_batch=8, fallback_load_ratio=2.0, ttft_slo_s=0.01)
    sources = (LiveSource(0, 6), LiveSource(1, 2), LiveSource(2, 6))
    waiting = (
        Waiting(5.0, 10),  # the router's queue
        Waiting(1.0, 10, source=1),  # queued on source 1 (not the partner): it stays
        Waiting(2.0, 10, source=0),  # queued on the partner
    )
    assert pair_with(sources, None) == 0  # the most outstanding, ties to the lowest id
    assert pair_with(sources, None, frozenset({0})) == 2  # 0 is another target's
    assert pair_with(sources, 1) == 1  # a pair is kept while it cooperates
    assert pair_with(sources[1:], 0) == 2  # its partner left: the most loaded of the rest
    assert pair_with(sources, None, frozenset({0, 1, 2})) is None
    assert takes_from(waiting, frozenset({0})) == (2, 0)
    assert takes_from(waiting, None) == (1, 2, 0)  # every queue (the counterfactual)
    view = LiveView(now_s=100.0, held_layers=2, sources=sources, waiting=waiting)
    state = LiveScalingState(settings)
    action = state.look(view)
    assert isinstance(action, RunBatch)
    assert (action.source, action.take, action.queues) == (0, (2, 0), frozenset({0}))
    assert state.partner == 0
    # the partner's load falls below another's: the pair stays
    calmer = replace(view, sources=(LiveSource(0, 1), LiveSource(1, 2), LiveSource(2, 6)))
    again = state.look(calmer)
    assert isinstance(again, RunBatch) and again.source == 0
    # another target holds the only free overloaded instances: this one does not pair
    other = LiveScalingState(settings)
    taken = replace(view, paired_elsewhere=frozenset({0, 1, 2}))
    assert other.look(taken) == Decline("unpaired") and other.partner is None
    second = other.look(replace(view, paired_elsewhere=frozenset({0})))
    assert isinstance(second, RunBatch) and second.source == 2 and second.take == (0,)
    # the counterfactual: the least loaded source, every queue, oldest first
    old = LiveScalingState(replace(settings, least_loaded=True)).look(view)
    assert isinstance(old, RunBatch)
    assert (old.source, old.take, old.queues) == (1, (1, 2, 0), None)
