"""FlexPipe §6.1 (Eq. 4/5) and §7 (Eq. 11/12): granularity follows load variability."""

import itertools
import math

import numpy as np
import pytest

from surge.errors import SurgeError
from surge.policy.flexpipe.granularity import (
    GranularityCandidate,
    GranularitySettings,
    GranularityState,
    ScalingSettings,
    choose_scaling_granularity,
    cv_of_arrivals,
    granularity_scores,
    instances_per_granularity,
    meets_scaling_slo,
    scaling_granularity,
    update_granularity,
)

# Coarse stages serve more and faster in steady state; fine stages suit bursts (§3.2).
CANDIDATES = (
    GranularityCandidate(2, 8, throughput_rps=100.0, latency_s=0.20, cv_target=0.3),
    GranularityCandidate(4, 8, throughput_rps=90.0, latency_s=0.24, cv_target=1.0),
    GranularityCandidate(8, 4, throughput_rps=75.0, latency_s=0.30, cv_target=2.5),
)
WINDOW = 64  # arrivals per CV sample


def arrivals(shape: float, num: int, seed: int) -> np.ndarray:
    """Gamma inter-arrivals with mean 1 s: CV = 1/sqrt(shape) (steady: large shape)."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.gamma(shape, 1.0 / shape, size=num))


def decisions(times: np.ndarray, settings: GranularitySettings) -> list[int]:
    state = GranularityState()
    out = []
    for end in range(WINDOW, len(times) + 1, WINDOW // 4):  # sliding window, 1/4 steps
        state = update_granularity(
            CANDIDATES, state, cv_of_arrivals(times[end - WINDOW : end]), settings
        )
        assert state.current is not None
        out.append(state.current)
    return out


def test_cv_of_regular_arrivals_is_zero_and_of_poisson_about_one() -> None:
    assert cv_of_arrivals([0.0, 1.0, 2.0, 3.0]) == 0.0
    assert cv_of_arrivals([1.0, 2.0]) == 0.0
    assert cv_of_arrivals(arrivals(1.0, 20_000, seed=1)) == pytest.approx(1.0, abs=0.05)


def test_eq4_by_hand() -> None:
    s = GranularitySettings(throughput_weight=0.25, cv_sensitivity=2.0)
    scores = granularity_scores(CANDIDATES, 1.0, s)
    c = CANDIDATES[2]
    expected = (0.25 * 75 / 100 + 0.75 * 0.20 / 0.30) * math.exp(-abs(1.0 - 2.5) / 2.0)
    assert scores[2] == pytest.approx(expected)
    assert c.num_stages == 8


def test_steady_load_picks_coarser_stages_than_bursty_load() -> None:
    s = GranularitySettings()
    steady = decisions(arrivals(25.0, 2000, seed=2), s)  # CV 0.2
    bursty = decisions(arrivals(0.15, 2000, seed=3), s)  # CV ~2.6
    stages = [c.num_stages for c in CANDIDATES]
    assert stages[steady[-1]] < stages[bursty[-1]]
    assert max(stages[k] for k in steady) < min(stages[k] for k in bursty)


def crossing_cv(settings: GranularitySettings) -> float:
    """The CV at which Eq. 4 scores the two coarsest candidates equally (bisection)."""
    low, high = CANDIDATES[0].cv_target, CANDIDATES[1].cv_target
    for _ in range(50):
        mid = (low + high) / 2
        scores = granularity_scores(CANDIDATES, mid, settings)
        low, high = (mid, high) if scores[0] > scores[1] else (low, mid)
    return low


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_no_oscillation_on_a_noisy_stationary_signal(seed: int) -> None:
    # Stationary gamma arrivals whose CV sits where the two coarsest candidates' Eq. 4
    # scores cross; each window's CV is noisy around it.
    settings = GranularitySettings()
    times = arrivals(crossing_cv(settings) ** -2, 4000, seed=seed)
    chosen = decisions(times, settings)
    switches = sum(a != b for a, b in itertools.pairwise(chosen))
    assert switches <= 1
    # The paper's bare argmax (no smoothing, no margin) flips on the same signal: the test
    # signal is noisy enough to matter.
    bare = decisions(times, GranularitySettings(cv_smoothing=1.0, switch_margin=0.0))
    assert sum(a != b for a, b in itertools.pairwise(bare)) >= 10


def test_eq5_finer_granularity_needs_more_instances_for_the_same_capacity() -> None:
    coarse, fine = CANDIDATES[0], CANDIDATES[2]
    # μ_k = T_k / (β1 + β2 η_k): 100 / (1 + 0.1 * 2) and 75 / (1 + 0.1 * 8);
    # 950 / (100 / 1.2) = 11.4 and 950 / (75 / 1.8) = 22.8.
    assert instances_per_granularity(950.0, coarse, 1.0, 0.1) == 11
    assert instances_per_granularity(950.0, fine, 1.0, 0.1) == 22
    with pytest.raises(SurgeError):
        instances_per_granularity(1000.0, fine, 0.0, 0.0)


def test_eq11_sigmoid_is_monotone_and_bounded() -> None:
    s = ScalingSettings(max_granularity=8, sigmoid_offset=3.0, sigmoid_steepness=2.0)
    assert scaling_granularity(0.0, 0, s) == math.floor(8 / 4)  # ⌊G_max / (1 + β)⌋
    values = [scaling_granularity(cv, q, s) for cv in (0.0, 0.5, 1.0, 2.0, 4.0) for q in (64,)]
    assert values == sorted(values)
    assert values[-1] <= 8
    # The queue saturates at Q_max: a longer queue changes nothing.
    assert scaling_granularity(2.0, 64, s) == scaling_granularity(2.0, 10_000, s)


def test_eq12_makes_the_scaling_finer_until_the_slo_holds() -> None:
    s = ScalingSettings(max_granularity=8, sigmoid_offset=3.0, sigmoid_steepness=2.0)
    # Calm: Eq. 11 alone gives 2 stages, which start in 1 + 8/2 = 5 s; deadline 10 s,
    # 2 stages x 2 rps x 5 s / queue 4 = 5 >= 5 requests: the sigmoid's choice stands.
    calm = choose_scaling_granularity(0.0, 4, 10.0, 1.0, 8.0, 2.0, 5, s)
    assert (calm.num_stages, calm.sigmoid_num_stages, calm.meets_slo) == (2, 2, True)
    assert meets_scaling_slo(10.0, 5.0, [2.0, 2.0], 4, 5)
    # Twice the requests: finer stages start sooner and add throughput.
    urgent = choose_scaling_granularity(0.0, 4, 10.0, 1.0, 8.0, 2.0, 10, s)
    assert urgent.meets_slo and urgent.num_stages > calm.num_stages
    m = urgent.num_stages
    assert meets_scaling_slo(10.0, 1.0 + 8.0 / m, [2.0] * m, 4, 10)
    assert not meets_scaling_slo(10.0, 1.0 + 8.0 / (m - 1), [2.0] * (m - 1), 4, 10)
    hopeless = choose_scaling_granularity(0.0, 4, 1.0, 1.0, 8.0, 2.0, 10, s)
    assert (hopeless.num_stages, hopeless.meets_slo) == (8, False)


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(SurgeError):
        GranularitySettings(throughput_weight=1.5)
    with pytest.raises(SurgeError):
        GranularitySettings(cv_smoothing=0.0)
    with pytest.raises(SurgeError):
        ScalingSettings(sigmoid_offset=0.0)
    with pytest.raises(SurgeError):
        GranularityCandidate(0, 1, 1.0, 1.0, 0.0)
    with pytest.raises(SurgeError):
        granularity_scores((), 1.0, GranularitySettings())
