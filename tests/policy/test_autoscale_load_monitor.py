"""BlitzScale's load monitor in `policy.autoscale` (§5.3): tokens/s and KV-cache use per
instance drive scale-out; the 2 s timeout drives scale-down. Pure: time is passed in."""

import pytest

from surge.errors import SurgeError
from surge.policy.autoscale import AutoscaleState, InstanceLoad, PoolLoad, decide
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.systems import system_config

BLITZ = system_config("blitzscale").autoscale
LAMBDA = system_config("lambdascale").autoscale


def _busy(iid: int, outstanding: int = 1, tokens_per_s: float = 0.0, kv: float = 0.0):
    return InstanceLoad(iid, outstanding, False, None, tokens_per_s=tokens_per_s, kv_usage=kv)


def _idle(iid: int, since_s: float) -> InstanceLoad:
    return InstanceLoad(iid, 0, loading=False, idle_since_s=since_s)


def test_blitzscale_monitors_tokens_and_kv_and_lambdascale_does_not() -> None:
    assert BLITZ.profile_bounds and not BLITZ.count_in_flight  # bounds: test_blitzscale_monitor
    assert BLITZ.target_kv_usage and BLITZ.downscale_delay_s == 2.0
    assert LAMBDA.target_tokens_per_s is None and LAMBDA.target_kv_usage is None
    assert LAMBDA.count_in_flight and not LAMBDA.profile_bounds
    assert LAMBDA.downscale_delay_s > BLITZ.downscale_delay_s


def test_tokens_per_s_over_the_bound_asks_for_enough_instances() -> None:
    s = AutoscaleSettings(target_ongoing_requests=100, target_tokens_per_s=500.0)
    # Two requests: concurrency alone wants one instance; 1,600 tokens/s want four.
    load = PoolLoad(10.0, 0, (_busy(1, 1, 900.0), _busy(2, 1, 700.0)))
    d = decide(load, s)
    assert d.desired == 4 and d.scale_out == 2
    calm = PoolLoad(10.0, 0, (_busy(1, 1, 400.0), _busy(2, 1, 100.0)))
    assert decide(calm, s).scale_out == 0
    # Without the bound, tokens/s does not count.
    assert decide(load, AutoscaleSettings(target_ongoing_requests=100)).desired == 1


def test_kv_use_over_the_bound_asks_for_enough_instances() -> None:
    s = AutoscaleSettings(target_ongoing_requests=100, target_kv_usage=0.5)
    load = PoolLoad(3.0, 0, (_busy(1, 2, kv=0.9), _busy(2, 1, kv=0.7)))
    d = decide(load, s)
    assert d.desired == 4 and d.scale_out == 2  # 1.6 caches' worth at half each


def test_the_monitor_keeps_a_loaded_instance_from_release() -> None:
    s = AutoscaleSettings(target_ongoing_requests=100, target_tokens_per_s=500.0)
    # One idle instance next to two busy ones carrying 1,200 tokens/s: three are needed.
    load = PoolLoad(20.0, 0, (_busy(1, 1, 600.0), _busy(2, 1, 600.0), _idle(3, 0.0)))
    assert decide(load, s).release == ()
    quiet = PoolLoad(20.0, 0, (_busy(1, 1, 300.0), _busy(2, 1, 100.0), _idle(3, 0.0)))
    assert decide(quiet, s).release == (3,)


@pytest.mark.parametrize(("system", "settings"), [("blitzscale", BLITZ), ("lambdascale", LAMBDA)])
def test_scale_down_waits_the_systems_timeout(system: str, settings: AutoscaleSettings) -> None:
    delay = settings.downscale_delay_s
    for have in (2, 1):  # above the last instance, and the last one (keep_alive_s None)
        instances = tuple(_idle(i, 100.0) for i in range(have))
        early = decide(PoolLoad(100.0 + delay - 0.1, 0, instances), settings, AutoscaleState())
        late = decide(PoolLoad(100.0 + delay, 0, instances), settings, AutoscaleState())
        assert early.release == () and early.wake_at_s == pytest.approx(100.0 + delay), system
        assert len(late.release) == have, system


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("target_tokens_per_s", 0.0, "target_tokens_per_s"),
        ("target_kv_usage", 1.5, r"target_kv_usage must be in \(0, 1\]"),
    ],
)
def test_bad_bounds_are_refused(field: str, value: float, words: str) -> None:
    with pytest.raises(SurgeError, match=words):
        AutoscaleSettings(**{field: value})
