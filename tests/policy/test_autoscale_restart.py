"""A controller restart changes no scaling decision (`policy.autoscale_restart`): a pool driven
by `decide` through a restart — its instances closed, its state replaced by what the old
controller carried — holds and releases instances when the same pool without the restart
does. Without the carry, the restarted pool starts empty: at zero at once, no always-ready
floor, and the keep-alive and the peak's lapse counted again from the restart."""

import pytest

from surge.errors import SurgeError
from surge.policy.autoscale import (
    AutoscaleState,
    InstanceLoad,
    PoolLoad,
    decide,
    idle_since,
    instances_quiet,
)
from surge.policy.autoscale_restart import Restart, carry
from surge.policy.autoscale_settings import AutoscaleSettings

STEP_S = 1.0


def _load(now_s: float, idle: dict[int, float], queued: int = 0) -> PoolLoad:
    return PoolLoad(now_s, queued, tuple(InstanceLoad(i, 0, False, s) for i, s in idle.items()))


def _run(
    settings: AutoscaleSettings,
    idle: dict[int, float],
    state: AutoscaleState,
    end_s: float,
    restart_s: float | None = None,
    carried: bool = True,
    adopt: bool = False,
) -> dict[float, int]:
    """Tick `decide` every second from 0 to `end_s` over instances that come up idle at once
    (the body); at `restart_s` the controller restarts: its instances are closed (or, with
    `adopt`, adopted with the idle times carried, `control/adoption.py`'s `settle`) and its
    state is what it carried (`carried`) or empty. Instances held at each tick."""
    idle, held, next_id = dict(idle), {}, 1000
    t = 0.0
    while t <= end_s:
        if restart_s is not None and t == restart_s:
            load = _load(t, idle)
            c = carry(
                state.peak_instances, state.restart, load.outstanding > 0, idle_since(load),
                len(idle), t, quiet=instances_quiet(load),
            )  # fmt: skip
            idle = {i: c.restart.quiet_of(i) for i in idle} if adopt and c else {}
            state = AutoscaleState()
            if carried and c is not None:
                state = AutoscaleState(peak_instances=c.peak_instances, restart=c.restart)
        d = decide(_load(t, idle), settings, state)
        state = d.state
        for iid in d.release:
            del idle[iid]
        for _ in range(d.scale_out):
            idle[next_id] = t  # up and idle at once: it has served nothing
            next_id += 1
        held[t] = len(idle)
        t += STEP_S
    return held


def _after(held: dict[float, int], from_s: float) -> dict[float, int]:
    return {t: n for t, n in held.items() if t > from_s}


KEEP = AutoscaleSettings(downscale_delay_s=60.0, keep_alive_s=900.0)
"""A deployment kept 15 minutes after its last request."""
FLEX = AutoscaleSettings(
    downscale_delay_s=300.0, keep_alive_s=None, always_ready_fraction=0.3,
    forget_peak_after_idle_s=900.0,
)  # fmt: skip
"""FlexPipe's (§9.1 floor, §9.4 5-minute reclamation, surge's 15-minute lapse)."""


def test_an_instance_idle_14_of_its_15_minutes_goes_1_minute_after_a_restart():
    idle = {0: 0.0}  # idle since 0
    plain = _run(KEEP, idle, AutoscaleState(peak_instances=1), 1000.0)
    restarted = _run(KEEP, idle, AutoscaleState(peak_instances=1), 1000.0, restart_s=840.0)
    assert plain[899.0] == 1 and plain[900.0] == 0
    assert _after(restarted, 840.0) == _after(plain, 840.0)
    # without the carry the restart closes the instance: at zero 60 s early
    empty = _run(KEEP, idle, AutoscaleState(peak_instances=1), 1000.0, 840.0, carried=False)
    assert empty[841.0] == 0


def test_flexpipe_keeps_its_floor_and_forgets_its_peak_on_time_across_a_restart():
    idle = {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}  # a peak of 4, idle since 0
    plain = _run(FLEX, idle, AutoscaleState(peak_instances=4), 1000.0)
    assert plain[299.0] == 4 and plain[300.0] == 2  # ceil(0.3 x 4) = 2 always ready
    assert plain[899.0] == 2 and plain[900.0] == 0  # the peak lapses at 15 minutes
    for restart_s in (100.0, 299.0, 600.0, 899.0):
        restarted = _run(FLEX, idle, AutoscaleState(peak_instances=4), 1000.0, restart_s)
        assert _after(restarted, restart_s) == _after(plain, restart_s), restart_s
    empty = _run(FLEX, idle, AutoscaleState(peak_instances=4), 1000.0, 600.0, carried=False)
    assert empty[601.0] == 0  # no peak after a restart that carried nothing: no floor


def test_each_instance_is_released_on_its_own_schedule_across_a_restart():
    # two instances last used at 0 and 200: the first goes at 300, the second 900 s after 200
    settings = AutoscaleSettings(downscale_delay_s=300.0, keep_alive_s=900.0)
    idle = {0: 0.0, 1: 200.0}
    plain = _run(settings, idle, AutoscaleState(peak_instances=2), 1200.0)
    assert plain[299.0] == 2 and plain[300.0] == 1
    assert plain[1099.0] == 1 and plain[1100.0] == 0
    for adopt in (True, False):  # adopted with their times, or closed and started again
        for restart_s in (100.0, 250.0, 299.0, 300.0, 700.0):
            restarted = _run(
                settings, idle, AutoscaleState(peak_instances=2), 1200.0, restart_s, adopt=adopt
            )
            assert _after(restarted, restart_s) == _after(plain, restart_s), (adopt, restart_s)
    # one time per pool (a version-1 state file): both held until 200 + 300
    one = Restart(200.0, 2)
    assert one.hold(300.0, 300.0, 900.0) == (2, 500.0)
    two = Restart(200.0, 2, ((0, 0.0), (1, 200.0)))
    assert two.hold(300.0, 300.0, 900.0) == (1, 1100.0)
    assert two.hold(250.0, 300.0, 900.0, max_replicas=1) == (1, 1100.0)  # the latest kept
    # instances the carry does not know take its spare times, the longest-idle first
    assert two.quiet_for([1, 5, 6]) == {1: 200.0, 5: 0.0, 6: 200.0}
    assert two.quiet_of(0) == 0.0 and two.quiet_of(9) == 200.0


def test_two_restarts_carry_the_first_ones_times():
    settings = KEEP
    first = Restart(quiet_since_s=0.0, held_instances=1)
    # the resumed pool's new instance came up idle at 500; the second restart at 700
    load = _load(700.0, {7: 500.0})
    c = carry(1, first, False, idle_since(load), 1, 700.0)
    assert c is not None and c.restart == first  # quiet since 0, not since 500
    d = decide(_load(899.0, {}), settings, AutoscaleState(peak_instances=1, restart=c.restart))
    assert d.scale_out == 1  # held until 900
    assert decide(_load(900.0, {8: 899.0}), settings, d.state).release == (8,)


def test_a_busy_pool_is_quiet_from_the_restart_and_a_request_ends_the_carry():
    c = carry(2, None, True, None, 2, 50.0)
    assert c is not None and c.restart == Restart(50.0, 2)
    state = AutoscaleState(peak_instances=2, restart=c.restart)
    busy = decide(_load(51.0, {}, queued=1), KEEP, state)
    assert busy.state.restart is None  # its own instances say from now on
    quiet = decide(_load(51.0, {}), KEEP, state)
    assert quiet.state.restart == c.restart and quiet.scale_out == 2
    up = _load(52.0, {1: 52.0, 2: 52.0})
    held = decide(up, KEEP, quiet.state)
    assert (held.scale_out, held.release, held.wake_at_s) == (0, (), 50.0 + 60.0)
    assert decide(up, KEEP, held.state) == held  # a fixed point


def test_nothing_to_carry_and_bad_values():
    assert carry(0, None, False, None, 0, 10.0) is None
    assert carry(0, None, False, 3.0, 1, 10.0).restart == Restart(3.0, 1)
    at_zero = carry(1, None, False, None, 0, 10.0)
    assert at_zero.restart.quiet_since_s == 10.0
    assert carry(1, None, False, None, 0, 20.0, last=at_zero).restart.quiet_since_s == 10.0
    with pytest.raises(SurgeError):
        Restart(float("nan"), 1)
    with pytest.raises(SurgeError):
        Restart(0.0, -1)
    with pytest.raises(SurgeError):
        Restart(0.0, 1, ((0, 0.0), (1, 0.0)))  # more times than instances
    with pytest.raises(SurgeError):
        Restart(0.0, 1, ((0, float("inf")),))
    # a busy pool: a busy instance quiet from now, an idle one since it went idle
    load = PoolLoad(9.0, 0, (InstanceLoad(0, 1, False, None), InstanceLoad(1, 0, False, 4.0)))
    assert instances_quiet(load) == ((0, 9.0), (1, 4.0))
    c = carry(2, None, True, None, 2, 9.0, quiet=instances_quiet(load))
    assert c.restart == Restart(9.0, 2, ((0, 9.0), (1, 4.0)))


def test_the_held_instances_within_max_replicas():
    r = Restart(0.0, 3)
    assert r.hold(10.0, 60.0, 900.0) == (3, 60.0)
    assert r.hold(10.0, 60.0, 900.0, max_replicas=2) == (2, 60.0)
    assert r.hold(60.0, 60.0, 900.0) == (1, 900.0)
    assert r.hold(900.0, 60.0, 900.0) == (0, None)
    assert r.hold(70.0, 60.0, 30.0) == (0, None)  # keep-alive shorter: all go at 60
    assert Restart(0.0, 1).hold(30.0, 60.0, 40.0) == (1, 40.0)
