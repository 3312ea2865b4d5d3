"""BlitzScale §5.3's monitor bounds from a real engine's measured steps (`StepProfile`,
`policy.blitzscale.monitor.profile_costs`): the bounds follow the measured step times
(straight lines between measured sizes, a prefill beyond the largest at its per-token cost, a
batch beyond the largest along the last segment), not any constant."""

import pytest

from surge.errors import SurgeError
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.blitzscale.monitor import StepProfile, bounds, profile_costs, profiled
from surge.policy.slo import Slo

PROFILE = StepProfile(
    prefill_s=((32, 0.10), (128, 0.30), (512, 1.00)),
    decode_s=((1, 0.05), (8, 0.08), (16, 0.11), (32, 0.17), (64, 0.25)),
)
SLO = Slo()  # 5 s TTFT, 200 ms TBT


def scaled(p: StepProfile, factor: float) -> StepProfile:
    return StepProfile(
        tuple((n, s * factor) for n, s in p.prefill_s),
        tuple((b, s * factor) for b, s in p.decode_s),
    )


def test_steps_between_and_beyond_the_measured_sizes() -> None:
    c = profile_costs(PROFILE, 4096, 64)
    assert c.decode_s(8) == pytest.approx(0.08)
    assert c.decode_s(12) == pytest.approx(0.095)  # halfway between 8 and 16
    assert c.decode_s(96) == pytest.approx(0.25 + 32 * (0.25 - 0.17) / 32)
    assert c.prefill_s(16) == pytest.approx(0.05)  # its share of the shortest
    assert c.prefill_s(320) == pytest.approx(0.65)
    assert c.prefill_s(4096) == pytest.approx(8 * 1.00)  # chunks at the largest's rate


def test_the_bounds_follow_the_measured_steps() -> None:
    b = bounds(profile_costs(PROFILE, 4096, 64), SLO)
    assert b.prefill_tokens_per_s == pytest.approx(512 / 1.00)
    # the largest batch whose step meets 200 ms: 32 + (0.2 - 0.17) / (0.08 / 32) = 44
    assert b.decode_batch == 44
    assert b.decode_tokens_per_s == pytest.approx(44 / 0.20)
    slow = bounds(profile_costs(scaled(PROFILE, 2.0), 4096, 64), SLO)
    assert slow.prefill_tokens_per_s == pytest.approx(b.prefill_tokens_per_s / 2)
    assert slow.decode_batch < b.decode_batch  # fewer sequences fit 200 ms
    assert slow.decode_tokens_per_s < b.decode_tokens_per_s / 2


def test_profiled_settings_take_the_profiles_bounds() -> None:
    s = profiled(AutoscaleSettings(profile_bounds=True), profile_costs(PROFILE, 4096, 64), SLO)
    assert s.target_prefill_tokens_per_s == pytest.approx(512.0)
    assert s.target_tokens_per_s == pytest.approx(220.0)


@pytest.mark.parametrize(
    "prefill, decode",
    [
        ((), ((1, 0.1),)),
        (((32, 0.1),), ((8, 0.1), (8, 0.2))),
        (((32, 0.1),), ((1, 0.0),)),
        (((32, float("nan")),), ((1, 0.1),)),
        (((0, 0.1),), ((1, 0.1),)),
    ],
)
def test_a_bad_profile_is_refused(prefill, decode) -> None:
    with pytest.raises(SurgeError, match="step profile"):
        StepProfile(prefill, decode)
