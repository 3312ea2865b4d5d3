"""BlitzScale's §5.3 load monitor as its default: prompt tokens/s, generated tokens/s and KV
use against per-instance bounds profiled offline from the model's cost and SLO
(`policy.blitzscale.monitor`); requests in flight size nothing. Other systems keep the
concurrency target."""

import pytest

from surge.errors import SurgeError
from surge.policy.autoscale import InstanceLoad, PoolLoad, decide
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.blitzscale.monitor import InstanceCosts, bounds, profiled
from surge.policy.slo import Slo
from surge.policy.systems import system_config

SLO_7B = Slo(ttft_s=0.45, tpot_s=0.15)
"""BlitzScale §3: 450 ms TTFT and 150 ms TBT for Llama2-7B."""
COSTS = InstanceCosts(
    prefill_s=lambda n: 0.01 + n / 10_000,  # 10k prompt tokens/s past a 10-ms step
    decode_s=lambda b: 0.02 + 0.002 * b,  # 150 ms at b = 65
    max_prefill_tokens=4000,
    max_batch=128,
)


def _busy(iid: int, outstanding: int, tokens_per_s: float = 0.0, kv: float = 0.0):
    return InstanceLoad(iid, outstanding, False, None, tokens_per_s=tokens_per_s, kv_usage=kv)


def test_bounds_are_profiled_from_the_costs_and_the_slo() -> None:
    b = bounds(COSTS, SLO_7B)
    assert b.prefill_tokens_per_s == pytest.approx(4000 / 0.41)
    assert b.decode_batch == 65  # the largest batch whose step meets the 150-ms TBT SLO
    assert b.decode_tokens_per_s == pytest.approx(65 / 0.15)
    # A step slower than the SLO even alone: one sequence at a time.
    assert bounds(COSTS, Slo(ttft_s=1.0, tpot_s=0.01)).decode_batch == 1
    with pytest.raises(SurgeError):
        InstanceCosts(COSTS.prefill_s, COSTS.decode_s, 0, 1)


def test_blitzscale_profiles_its_bounds_and_keeps_a_deployments_own() -> None:
    blitz = system_config("blitzscale").autoscale
    s = profiled(blitz, COSTS, SLO_7B)
    assert s.target_prefill_tokens_per_s == pytest.approx(4000 / 0.41)
    assert s.prefill_within_s == 0.45 and s.target_tokens_per_s == pytest.approx(65 / 0.15)
    assert s.target_kv_usage == 0.8 and not s.count_in_flight
    mine = profiled(AutoscaleSettings(profile_bounds=True, target_tokens_per_s=50.0), COSTS, SLO_7B)
    assert mine.target_tokens_per_s == 50.0 and mine.prefill_within_s == 0.45
    # The other systems keep the concurrency target and nothing is profiled for them.
    for name in ("lambdascale", "flexpipe", "paraserve", "serverlessllm"):
        other = system_config(name).autoscale
        assert other.count_in_flight and not other.profile_bounds
        assert profiled(other, COSTS, SLO_7B) is other


def test_blitzscale_sizes_prefill_by_waiting_prompt_tokens_not_requests_in_flight() -> None:
    s = profiled(system_config("blitzscale").autoscale, COSTS, SLO_7B)
    per_instance = s.target_prefill_tokens_per_s * 0.45  # ~4,390 prompt tokens within the SLO
    # Two requests of 6,000 prompt tokens: ~2.7 instances' worth of prefill; 8 in flight
    # per instance (the shipped concurrency target) would have asked for one.
    long = PoolLoad(5.0, 0, (_busy(1, 2),), pending_prefill_tokens=12_000)
    assert 12_000 / per_instance == pytest.approx(2.73, abs=0.01)
    assert decide(long, s).desired == 3
    # Sixteen short requests decoding, nothing waiting for a first token: decode load only.
    decoding = PoolLoad(5.0, 0, (_busy(1, 16, tokens_per_s=200.0, kv=0.3),))
    assert decide(decoding, s).desired == 1
    # Prefill and decode add up (P/D: each role on its own load, BlitzScale §6.1).
    both = PoolLoad(5.0, 0, (_busy(1, 2), _busy(2, 16, 300.0, 0.9)), pending_prefill_tokens=4000)
    assert decide(both, s).desired == 1 + 2  # 0.91 prefill + 0.9 / 0.8 KV -> ceil(2.04)


def test_an_instance_at_exactly_its_bound_asks_for_no_other() -> None:
    s = AutoscaleSettings(count_in_flight=False, target_tokens_per_s=0.1 + 0.2)
    load = PoolLoad(1.0, 0, tuple(_busy(i, 1, 0.1 + 0.2) for i in range(3)))
    assert decide(load, s).desired == 3


def test_without_in_flight_counting_there_is_no_panic() -> None:
    s = AutoscaleSettings(count_in_flight=False, target_kv_usage=0.8, panic_window_s=1.0)
    load = PoolLoad(1.0, 40, (_busy(1, 30, kv=0.1),))
    d = decide(load, s)
    assert d.desired == 1 and d.state.panic_until_s is None
    with pytest.raises(SurgeError, match="prefill_within_s"):
        AutoscaleSettings(prefill_within_s=0.0)
