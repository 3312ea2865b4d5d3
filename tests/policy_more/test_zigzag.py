"""BlitzScale zigzag (§5.2, Eq. 1): feasibility, optimality vs brute force and best effort,
and `surge plan zigzag`."""

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from surge.cli.plan import app
from surge.errors import SurgeError
from surge.policy.blitzscale.zigzag import (
    ZigzagProblem,
    average_latency,
    batch_latencies,
    best_effort,
    solve_zigzag,
    violations,
)

RUNNER = CliRunner()
# Multiples of 1/4 keep C3's products exact in floating point.
RATIOS = st.sampled_from([0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 6.0])


def brute_force_optimum(problem: ZigzagProblem) -> float:
    """Smallest Eq. 1 average latency over every (T_1..T_N) in 0..L that meets C1-C3."""
    best = float("inf")
    layers = problem.num_layers
    for targets in itertools.product(range(layers + 1), repeat=problem.num_batches):
        splits = tuple((t, layers - t) for t in targets)
        if not violations(problem, splits):
            best = min(best, average_latency(splits))
    return best


def test_latency_is_the_source_finish_time_of_each_batch() -> None:
    # Fig. 12 (b): "request 3's latency is 17 (12 for the request 1 and 2's execution and 5
    # for its own)", requests 1 and 2 split (1, 6) and request 3 (2, 5).
    splits = ((1, 6), (1, 6), (2, 5))
    assert batch_latencies(splits) == (6, 12, 17)
    assert average_latency(splits) == pytest.approx((6 + 12 + 17) / 3)


def test_violations_name_each_broken_constraint() -> None:
    problem = ZigzagProblem(num_layers=4, load_ratio=2.0, num_batches=2)
    assert violations(problem, ((1, 3), (1, 3))) == []
    assert any(v.startswith("C1") for v in violations(problem, ((1, 2), (1, 3))))
    assert any(v.startswith("C3") for v in violations(problem, ((2, 2), (0, 4))))
    # Batch 2 needs 3 layers on the target (done at 1 + 3 = 4) before the source starts it
    # at 3: C2. Its 3 layers are loaded only at 2 * (3 - 1) = 4 > 1: C3 as well.
    broken = violations(problem, ((1, 3), (3, 1)))
    assert {v[:2] for v in broken} == {"C2", "C3"}


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 40),
    ratio=RATIOS,
    batches=st.integers(1, 12),
    resident=st.integers(0, 2),
)
def test_ilp_meets_c1_c3_and_is_no_worse_than_best_effort(
    layers: int, ratio: float, batches: int, resident: int
) -> None:
    problem = ZigzagProblem(layers, ratio, batches, resident_layers_at_start=min(resident, layers))
    ilp, baseline = solve_zigzag(problem), best_effort(problem)
    assert violations(problem, ilp.splits) == []
    assert violations(problem, baseline.splits) == []
    assert ilp.avg_latency == pytest.approx(average_latency(ilp.splits))
    assert ilp.avg_latency <= baseline.avg_latency + 1e-9
    assert all(t <= layers // 2 for t, _ in baseline.splits)


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 5), ratio=RATIOS, batches=st.integers(1, 4))
def test_ilp_matches_brute_force_on_small_instances(
    layers: int, ratio: float, batches: int
) -> None:
    problem = ZigzagProblem(layers, ratio, batches)
    assert solve_zigzag(problem).avg_latency == pytest.approx(brute_force_optimum(problem))


def test_fast_loading_lets_the_ilp_beat_best_effort() -> None:
    # Loading a layer as fast as computing one: best effort stops at half the model per
    # batch, the ILP may give the target more once the source has a backlog (C2).
    problem = ZigzagProblem(num_layers=32, load_ratio=1.0, num_batches=12)
    assert solve_zigzag(problem).avg_latency < best_effort(problem).avg_latency


def test_first_batch_runs_only_the_resident_layers_on_the_target() -> None:
    # Fig. 12: before the second layer lands, a batch can only use a (1, L - 1) split.
    problem = ZigzagProblem(num_layers=7, load_ratio=6.0, num_batches=6)
    for schedule in (solve_zigzag(problem), best_effort(problem)):
        assert schedule.splits[0] == (1, 6)
        assert all(t <= 1 for t, _ in schedule.splits)  # 6 layer-times pass only at batch 7


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_layers": 0, "load_ratio": 1.0, "num_batches": 1},
        {"num_layers": 4, "load_ratio": 0.0, "num_batches": 1},
        {"num_layers": 4, "load_ratio": float("nan"), "num_batches": 1},
        {"num_layers": 4, "load_ratio": 1.0, "num_batches": 0},
        {"num_layers": 4, "load_ratio": 1.0, "num_batches": 1, "resident_layers_at_start": 5},
    ],
)
def test_bad_problems_are_user_errors(kwargs: dict) -> None:
    with pytest.raises(SurgeError):
        ZigzagProblem(**kwargs)


def test_cli_json_has_exactly_the_issue_shape() -> None:
    result = RUNNER.invoke(
        app, ["zigzag", "--layers", "8", "--load-ratio", "1", "--batches", "5", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out) == {"layers", "load_ratio", "batches", "solve_ms", "schedules"}
    assert (out["layers"], out["load_ratio"], out["batches"]) == (8, 1.0, 5)
    assert out["solve_ms"] >= 0
    assert set(out["schedules"]) == {"zigzag", "best_effort"}
    problem = ZigzagProblem(8, 1.0, 5)
    for schedule in out["schedules"].values():
        assert set(schedule) == {"splits", "avg_latency"}
        splits = tuple(tuple(s) for s in schedule["splits"])
        assert violations(problem, splits) == []
        assert schedule["avg_latency"] == pytest.approx(average_latency(splits))
    zz, be = out["schedules"]["zigzag"], out["schedules"]["best_effort"]
    assert zz["avg_latency"] <= be["avg_latency"]


def test_cli_text_lists_both_schedules() -> None:
    result = RUNNER.invoke(app, ["zigzag", "--layers", "4", "--load-ratio", "2", "--batches", "3"])
    assert result.exit_code == 0, result.output
    assert "zigzag (ILP)" in result.output and "best effort" in result.output


def test_cli_bad_arguments_raise_user_errors() -> None:
    result = RUNNER.invoke(app, ["zigzag", "--layers", "4", "--load-ratio", "-1", "--batches", "3"])
    assert isinstance(result.exception, SurgeError)
    assert "load ratio" in str(result.exception)
