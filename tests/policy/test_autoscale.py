"""The autoscaler's Knative rules, now in `surge.policy.autoscale` for both bodies: the
stable (upscale) window, the panic window, the last instance's keep-alive, and FlexPipe's
always-ready floor (a fraction of the pool's historical peak, §9.1), forgotten once the pool
has idled `forget_peak_after_idle_s` (scale to zero)."""

from dataclasses import replace

import pytest

from surge.errors import SurgeError
from surge.policy.autoscale import (
    AutoscaleState,
    InstanceLoad,
    PoolLoad,
    decide,
    idle_since,
    ready_floor,
)
from surge.policy.autoscale_settings import AutoscaleSettings


def _busy(iid: int, n: int) -> InstanceLoad:
    return InstanceLoad(iid, n, loading=False, idle_since_s=None)


def _idle(iid: int, since: float) -> InstanceLoad:
    return InstanceLoad(iid, 0, loading=False, idle_since_s=since)


def test_upscale_waits_for_the_stable_window_then_fires() -> None:
    s = AutoscaleSettings(target_ongoing_requests=4, upscale_delay_s=1.0, panic_threshold=10)
    d = decide(PoolLoad(0.0, 3, (_busy(1, 4),)), s)
    assert d.desired == 2 and d.scale_out == 0 and d.state.want_since_s == 0.0
    assert d.wake_at_s == 1.0
    d = decide(PoolLoad(0.5, 3, (_busy(1, 4),)), s, d.state)
    assert d.scale_out == 0 and d.state.want_since_s == 0.0  # the window keeps its start
    d = decide(PoolLoad(1.0, 3, (_busy(1, 4),)), s, d.state)
    assert d.scale_out == 1 and d.state.want_since_s is None
    # A dip below the target resets the window.
    d1 = decide(PoolLoad(0.0, 3, (_busy(1, 4),)), s)
    d2 = decide(PoolLoad(0.5, 0, (_busy(1, 2),)), s, d1.state)
    assert d2.state.want_since_s is None
    assert decide(PoolLoad(1.0, 3, (_busy(1, 4),)), s, d2.state).scale_out == 0


def test_zero_and_panic_skip_the_stable_window() -> None:
    s = AutoscaleSettings(target_ongoing_requests=4, upscale_delay_s=5.0)
    assert decide(PoolLoad(0.0, 1, ()), s).scale_out == 1  # the activator: at zero, at once
    burst = decide(PoolLoad(0.0, 20, (_busy(1, 4),)), s)  # 24 >= 2 x 4 x 1: panic
    assert burst.scale_out == 5 and burst.state.panic_until_s == pytest.approx(1.0)


def test_no_release_in_panic_and_the_last_instance_keeps_alive() -> None:
    s = AutoscaleSettings(target_ongoing_requests=4, downscale_delay_s=2, keep_alive_s=10)
    panic = AutoscaleState(panic_until_s=5.0)
    idle = (_idle(1, 0.0), _idle(2, 0.0))
    assert decide(PoolLoad(4.0, 0, idle), s, panic).release == ()
    d = decide(PoolLoad(6.0, 0, idle), s, panic)
    assert d.release == (1,)  # the last one waits for keep_alive_s
    assert d.wake_at_s == 10.0
    assert decide(PoolLoad(10.0, 0, idle), s, panic).release == (1, 2)
    same = AutoscaleSettings(target_ongoing_requests=4, downscale_delay_s=2, keep_alive_s=None)
    assert decide(PoolLoad(2.0, 0, idle), same).release == (1, 2)


def test_the_always_ready_floor_keeps_a_fraction_of_the_peak() -> None:
    """FlexPipe §9.1: 30% of the peak always ready. A pool that reached 7 instances keeps
    ceil(0.3 x 7) = 3 however long they idle; without the floor all 7 go."""
    s = AutoscaleSettings(
        target_ongoing_requests=4, downscale_delay_s=2, keep_alive_s=None, panic_window_s=0
    )
    floor = replace(s, always_ready_fraction=0.3)
    busy = tuple(_busy(i, 4) for i in range(1, 8))
    idle = tuple(_idle(i, 0.0) for i in range(1, 8))
    for settings, kept in ((s, 0), (floor, 3)):
        d = decide(PoolLoad(0.0, 0, busy), settings)
        assert d.state.peak_instances == 7
        d = decide(PoolLoad(100.0, 0, idle), settings, d.state)
        assert len(d.release) == 7 - kept and d.desired == kept
        assert d.state.peak_instances == 7  # the peak is history: releases keep it
    # the floor is a fixed point: fed its own state with the same load it returns itself
    d1 = decide(PoolLoad(100.0, 0, idle[:3]), floor, d.state)
    assert d1.release == () and d1.scale_out == 0
    assert decide(PoolLoad(100.0, 0, idle[:3]), floor, d1.state) == d1
    # a pool that never held an instance has no floor (scale to zero until first used)
    assert decide(PoolLoad(0.0, 0, ()), floor).desired == 0
    assert ready_floor(7, replace(floor, max_replicas=2)) == 2
    with pytest.raises(SurgeError):
        AutoscaleSettings(always_ready_fraction=1.5)


def test_an_idle_pool_forgets_its_peak_and_goes_to_zero() -> None:
    """A pool that reached 7 instances keeps ceil(0.3 x 7) = 3 while it idles less than
    `forget_peak_after_idle_s`, wakes when that runs out, then forgets the peak and
    releases all 3 (each has idled past its delays); the next load starts a new peak."""
    s = AutoscaleSettings(
        target_ongoing_requests=4,
        downscale_delay_s=2,
        keep_alive_s=None,
        panic_window_s=0,
        always_ready_fraction=0.3,
        forget_peak_after_idle_s=60,
    )
    d = decide(PoolLoad(0.0, 0, tuple(_busy(i, 4) for i in range(1, 8))), s)
    idle = (_idle(1, 5.0), _idle(2, 9.0), _idle(3, 7.0))  # the pool idles since 9.0
    assert idle_since(PoolLoad(20.0, 0, idle)) == 9.0
    held = decide(PoolLoad(20.0, 0, idle), s, d.state)
    assert held.release == () and held.desired == 3 and held.wake_at_s == 69.0
    gone = decide(PoolLoad(69.0, 0, idle), s, held.state)
    assert gone.release == (1, 3, 2) and gone.desired == 0
    assert gone.state.peak_instances == 0
    # a fixed point while it stays idle: the instances it still holds do not count again
    assert decide(PoolLoad(69.0, 0, idle), s, gone.state) == gone
    back = decide(PoolLoad(80.0, 2, ()), s, gone.state)  # load again, at zero
    assert back.scale_out == 1 and back.state.peak_instances == 0
    assert decide(PoolLoad(81.0, 0, (_busy(4, 2),)), s, back.state).state.peak_instances == 1
    # never forgotten (None): the floor stays, as before the setting existed
    never = replace(s, forget_peak_after_idle_s=None)
    kept = decide(PoolLoad(1e6, 0, idle), never, d.state)
    assert kept.release == () and kept.desired == 3 and kept.wake_at_s is None
    # a request anywhere, or one loading instance, and the pool is not idle
    assert idle_since(PoolLoad(20.0, 1, idle)) is None
    assert idle_since(PoolLoad(20.0, 0, (*idle, InstanceLoad(4, 0, True, None)))) is None
    assert idle_since(PoolLoad(20.0, 0, ())) is None
    for bad in (0, -1.0):
        with pytest.raises(SurgeError, match="forget_peak_after_idle_s"):
            AutoscaleSettings(forget_peak_after_idle_s=bad)


def test_capped_settings_and_bad_knobs() -> None:
    s = AutoscaleSettings(min_replicas=3, max_replicas=8).capped(2)
    assert (s.min_replicas, s.max_replicas) == (2, 2)
    assert AutoscaleSettings().capped(0).max_replicas == 1
    for bad in (
        {"target_ongoing_requests": 0},
        {"panic_threshold": 0.5},
        {"upscale_delay_s": -1},
        {"keep_alive_s": -1},
        {"min_replicas": 2, "max_replicas": 1},
    ):
        with pytest.raises(SurgeError):
            AutoscaleSettings(**bad)
