"""ParaServe §6.1: the sliding-window predictor choosing scale-down vs scale-up."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surge.errors import SurgeError
from surge.policy.paraserve.predictor import (
    PredictorSettings,
    decide_consolidation,
    plan_groups,
    predicted_arrivals,
)


def test_only_arrivals_inside_the_past_window_count() -> None:
    arrivals = [0.0, 40.0, 41.0, 99.0, 100.0, 101.0]
    # The window is (40, 100]: 40 has left it, 101 has not happened yet.
    assert predicted_arrivals(arrivals, now_s=100.0, window_s=60.0) == 3


def test_quiet_model_scales_down_to_one_worker() -> None:
    decision = decide_consolidation(
        [5.0], 100.0, queue_length=0, pipeline_size=4, settings=PredictorSettings(window_s=60.0)
    )
    assert decision.mode == "scale_down"
    assert decision.num_workers_to_keep == 1
    assert [(g.num_workers, g.num_workers_to_keep) for g in decision.groups] == [(4, 1)]


def test_burst_scales_up_to_queue_plus_predicted_arrivals() -> None:
    settings = PredictorSettings(window_s=10.0, requests_per_worker=2)
    arrivals = [95.0 + 0.5 * i for i in range(7)]  # 7 in the last 10 s
    decision = decide_consolidation(
        arrivals, 100.0, queue_length=3, pipeline_size=2, settings=settings
    )
    assert decision.mode == "scale_up"
    assert decision.predicted_arrivals == 7
    assert decision.num_workers_to_keep == 5  # ceil((3 + 7) / 2)
    assert sum(g.num_workers_to_keep for g in decision.groups) == 5


def test_fig7_thirty_workers_are_seven_groups_of_four_and_one_of_two() -> None:
    groups = plan_groups(30, pipeline_size=2, max_pipeline_size=4)
    assert sorted(g.num_workers for g in groups) == [2] + [4] * 7
    assert all(g.num_workers_to_keep == g.num_workers for g in groups)


@given(wanted=st.integers(1, 100), size=st.integers(1, 4), max_size=st.integers(1, 8))
def test_groups_are_never_smaller_than_the_sized_pipeline_and_keep_exactly_the_wanted(
    wanted: int, size: int, max_size: int
) -> None:
    groups = plan_groups(wanted, size, max_size)
    assert sum(g.num_workers_to_keep for g in groups) == wanted
    assert all(g.num_workers >= size for g in groups)
    assert all(1 <= g.num_workers_to_keep <= g.num_workers for g in groups)
    assert all(g.num_workers <= max(size, max_size) for g in groups)


def test_more_recent_load_never_keeps_fewer_workers() -> None:
    settings = PredictorSettings(window_s=30.0)
    kept = [
        decide_consolidation([90.0] * n, 100.0, 0, 2, settings).num_workers_to_keep
        for n in range(10)
    ]
    assert kept == sorted(kept)


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(SurgeError):
        PredictorSettings(window_s=0.0)
    with pytest.raises(SurgeError):
        PredictorSettings(requests_per_worker=0)
    with pytest.raises(SurgeError):
        decide_consolidation([], 0.0, -1, 2, PredictorSettings())
