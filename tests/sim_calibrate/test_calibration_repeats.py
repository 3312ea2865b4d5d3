"""The calibration's repeats (`benchmarks/sim_calibrate/repeats.py`, `sim_calibrate/rounds.py`):
the rotated burst order, the per-percentile median / spread / error, the interleaving of
bursts and profile rounds, the median profile, and bad options. Not the long run itself."""

import json
import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.sim_calibrate.repeats import (
    PERCENTILES,
    SCENARIOS,
    BurstSettings,
    bursts_of,
    cpu_shares,
    measured_summary,
    paired_errors,
    relative_errors,
    rotated_order,
    run_interleaved,
    scenario_name,
    spread,
)
from benchmarks.sim_calibrate.rounds import profile_of, rounds_of

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "benchmarks" / "results" / "sim_calibrate" / "sim_calibration.json"
BURST = ROOT / "benchmarks" / "results" / "scaleout" / "scale_burst.json"
CONTENTION = (
    ROOT / "benchmarks" / "sim_calibrate" / "recorded" / "sim_calibration_contention_loaded.json"
)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_rotation_puts_every_scenario_in_every_position(n: int) -> None:
    items = tuple(range(n))
    orders = [rotated_order(items, r) for r in range(n)]
    assert orders[0] == list(items)
    for order in orders:
        assert sorted(order) == list(items)  # each repeat runs every scenario once
    for pos in range(n):
        assert sorted(o[pos] for o in orders) == list(items)  # each one in every slot
    assert rotated_order(items, n + 1) == orders[1]  # periodic past len(items)
    assert orders[1][-1] == items[0]  # the first of one repeat is last in the next


def test_spread_is_median_min_max_of_the_repeats() -> None:
    values = [2.34, 3.40, 2.9, 3.1]
    s = spread(values)
    med = statistics.median(values)
    assert s["median"] == pytest.approx(med, abs=1e-4)
    assert (s["min"], s["max"]) == (min(values), max(values))
    assert s["min_vs_median"] == pytest.approx(min(values) / med - 1, abs=1e-4)
    assert s["max_vs_median"] == pytest.approx(max(values) / med - 1, abs=1e-4)
    assert s["min_vs_median"] <= 0 <= s["max_vs_median"]
    assert s["by_repeat"] == values  # every repeat's raw number kept, in order
    one = spread([1.5])
    assert one["median"] == one["min"] == one["max"] == 1.5 and one["max_vs_median"] == 0
    with pytest.raises(ValueError):
        spread([])


def test_error_is_against_the_median_of_each_percentile() -> None:
    bursts = [
        {"ttft_p50_s": 2.0, "ttft_p90_s": 3.4, "other": 1},
        {"ttft_p50_s": 1.6, "ttft_p90_s": 2.3, "other": 2},
        {"ttft_p50_s": 2.2, "ttft_p90_s": 3.0, "other": 3},
    ]
    measured = measured_summary(bursts)
    assert set(measured) == set(PERCENTILES)
    predicted = {"ttft_p50_s": 1.8, "ttft_p90_s": 3.3}
    errs = relative_errors(predicted, measured)
    for q in PERCENTILES:
        med = statistics.median(b[q] for b in bursts)
        assert measured[q]["median"] == pytest.approx(med)
        assert errs[q] == pytest.approx(predicted[q] / med - 1, abs=1e-4)
    assert errs["ttft_p50_s"] < 0 < errs["ttft_p90_s"]  # low p50, high p90
    # one outlier repeat moves the spread, not the median the error is taken against
    wild = [*bursts, {"ttft_p50_s": 9.0, "ttft_p90_s": 0.1}]
    assert measured_summary(wild)["ttft_p50_s"]["max"] == 9.0
    assert abs(relative_errors(predicted, measured_summary(wild))["ttft_p50_s"]) < 0.2


def test_paired_errors_match_each_repeat_with_its_own_profile() -> None:
    bursts = [{"ttft_p50_s": 2.0, "ttft_p90_s": 4.0}, {"ttft_p50_s": 1.0, "ttft_p90_s": 2.0}]
    preds = [{"ttft_p50_s": 2.2, "ttft_p90_s": 4.0}, {"ttft_p50_s": 0.9, "ttft_p90_s": 2.4}]
    out = paired_errors(preds, bursts)
    for q in PERCENTILES:
        errs = [p[q] / b[q] - 1 for p, b in zip(preds, bursts, strict=True)]
        assert out[q]["by_repeat"] == pytest.approx(errs, abs=1e-4)
        assert out[q]["median"] == pytest.approx(statistics.median(errs), abs=1e-4)
    with pytest.raises(ValueError):
        paired_errors(preds[:1], bursts)


def test_older_calibrations_give_their_bursts_as_one_repeat() -> None:
    committed = [
        {scenario_name(k, m): {"sources": k, "nodes": 8, "modes": {}} for k, m in SCENARIOS}
    ]
    rows = {
        scenario_name(k, m): {"measured": {"ttft_p50_s": k + 0.1, "ttft_p90_s": k + 0.5}}
        for k, m in SCENARIOS
    }
    (rep,) = bursts_of({"scenarios": rows}, committed)
    for k, m in SCENARIOS:
        name = scenario_name(k, m)
        assert rep[name]["sources"] == k and rep[name]["nodes"] == 8  # the committed settings
        assert rep[name]["modes"][m] == rows[name]["measured"]
    raw = [{"a": 1}, {"a": 2}]
    assert bursts_of({"bursts": raw, "scenarios": rows}, committed) == raw  # raw repeats first
    with pytest.raises(ValueError, match="K=2/stop_the_world"):
        bursts_of({"scenarios": {n: r for n, r in rows.items() if "K=2/stop" not in n}}, committed)


def test_cpu_shares_between_two_samples() -> None:
    # user nice system idle iowait irq softirq steal
    before = [100, 0, 50, 300, 10, 0, 0, 5]
    after = [160, 0, 70, 310, 10, 0, 0, 15]  # +60 +20 user/system, +10 idle, +10 steal
    # 100 ticks at 100 Hz on 2 CPUs: 0.5 s of wall; 0.9 s busy, of which this run's 0.5 s
    s = cpu_shares(before, after, own_s=0.5, hz=100, cpus=2)
    assert s["idle"] == pytest.approx(10 / 100)
    assert s["busy"] == pytest.approx(90 / 100)
    assert s["steal"] == pytest.approx(10 / 100)
    assert s["others_cores"] == pytest.approx((0.9 - 0.5) / 0.5)  # 0.8 cores on average
    assert s["own_cores"] == pytest.approx(0.5 / 0.5)  # this run: 1 core on average
    alone = cpu_shares(before, after, own_s=2.0, hz=100, cpus=2)
    assert alone["others_cores"] == 0  # never negative (own counted past the window)
    assert cpu_shares(after, after, 0.0, 100, 2)["steal"] == 0  # no time: no division by 0


def test_bursts_interleave_with_profile_rounds_in_rotated_order(caplog) -> None:
    calls: list = []

    def burst(k: int, mode: str, settings: BurstSettings) -> dict:
        calls.append((k, mode))
        t = 1.0 + k + len(calls) / 100
        return {"sources": k, "modes": {mode: {"ttft_p50_s": t, "ttft_p90_s": 2 * t}}}

    def measure(r: int) -> dict:
        calls.append(("round", r))
        return {"round": r}

    caplog.set_level(logging.INFO, logger="sim_calibrate")
    bursts, rounds = run_interleaved(3, BurstSettings(requests=8), measure, burst)
    n = len(SCENARIOS)
    assert [x["round"] for x in rounds] == [0, 1, 2]
    for x in [*rounds, *(b for rep in bursts for b in rep.values())]:
        state = x["machine_state"]  # the shared machine's state beside each
        assert 0 <= state["busy"] <= 1 and state["others_cores"] >= 0
    for r in range(3):
        chunk = calls[r * (n + 1) : (r + 1) * (n + 1)]
        assert chunk[:n] == rotated_order(SCENARIOS, r)  # this repeat's bursts, rotated
        assert chunk[n] == ("round", r)  # then its profile round
        assert list(bursts[r]) == [scenario_name(k, m) for k, m in rotated_order(SCENARIOS, r)]
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 3 * (n + 1)  # one progress line per burst and per round
    assert lines[-1].startswith(f"[{3 * (n + 1)}/{3 * (n + 1)}]")
    _, none = run_interleaved(1, BurstSettings(), None, burst)  # reused profile: bursts only
    assert none == []


def _round(scale: float) -> dict:
    """One profile round as `measure_round` returns it, every cost times `scale`."""
    layer = {"prefill_fixed": 2e-3, "prefill_per_token": 4e-5, "decode_fixed": 1.8e-3}
    return {
        "engine": {
            "num_layers": 16,
            "model_bytes": 64_000_000,
            "agent_round_trip_per_step_s": 0.01 * scale,
            "per_layer_s": {k: v * scale for k, v in layer.items()} | {"decode_per_seq": 1e-4},
        },
        "transport": {"transfer_cores": 0.2 * scale, "multicast_effective_gbps": 0.4 / scale},
        "endpoint_open": {"endpoint_open_s": 0.03 * scale, "pipeline_open_s": 0.04 * scale},
        "send_cost": {"rounds": [{"send_cost_s_per_gb": 0.8 * scale}] * 2},
        "pipeline_serving": {"stages": 2, "pipeline_throughput_vs_local": 1.1 / scale},
    }


def test_median_profile_is_the_median_of_the_rounds_profiles() -> None:
    real = json.loads(BURST.read_text())
    rounds = [_round(s) for s in (1.0, 1.6, 0.9)]
    each = [profile_of([r], real) for r in rounds]
    both = profile_of(rounds, real)
    for key in ("transfer_cores", "endpoint_open_s", "pipeline_open_s", "send_cost_s_per_gb"):
        assert both[key] == pytest.approx(statistics.median(p[key] for p in each))
        assert each[0][key] < each[1][key]  # the rounds do differ
    fixed = [p["engine"]["per_layer_s"]["decode_fixed"] for p in each]
    assert both["engine"]["per_layer_s"]["decode_fixed"] == pytest.approx(statistics.median(fixed))
    assert len(both["engine"]["runs"]) == 3  # every round's raw numbers kept
    assert len(both["send_cost"]["runs"]) == 6  # the send cost: median of all its rounds
    assert 0 < both["pipeline_speed"] != each[1]["pipeline_speed"]


def test_a_send_cost_measured_below_zero_gives_the_simulator_zero() -> None:
    # Serving measured faster while sending (noise around no loss) once crashed a whole
    # 10-minute calibration at its last step: SimSettings refuses a negative send cost.
    real = json.loads(BURST.read_text())
    noisy = _round(1.0) | {"send_cost": {"rounds": [{"send_cost_s_per_gb": -0.3}] * 2}}
    profile = profile_of([noisy], real)
    assert profile["send_cost_s_per_gb"] == 0.0
    assert profile["send_cost"]["send_cost_s_per_gb"] == pytest.approx(-0.3)  # raw kept


def test_a_calibration_reads_back_its_own_profile() -> None:
    # --reuse: the committed calibration's rounds give back the numbers it wrote
    old = json.loads(COMMITTED.read_text())
    again = profile_of(rounds_of(old), json.loads(BURST.read_text()))
    keys = ("transfer_cores", "endpoint_open_s", "pipeline_open_s", "send_cost_s_per_gb")
    for key in (*keys, "pipeline_speed"):
        assert again[key] == pytest.approx(old[key]), key
    assert again["engine"]["per_layer_s"] == pytest.approx(old["engine"]["per_layer_s"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--requests", "-3"], "--requests must be at least 1"),
        (["--cores", "0"], "--cores must be positive"),
        (["--run-real", "--bursts", str(COMMITTED)], "give one of them"),
        (["--reuse", "/nonexistent/calib.json"], "cannot read calibration"),
        (["--bursts", str(BURST)], "has no K=1/execute_while_load"),
        (["--reuse", str(CONTENTION)], "no full profile round"),
    ],
)
def test_bad_options_give_one_error_line(argv: list[str], message: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.sim_calibrate.main", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.stderr


def test_cores_during_splits_a_run_by_process() -> None:
    """`scale_burst`'s CPU split: /proc CPU seconds grow with work done, and the cores of
    the controller and of each agent are CPU seconds over the burst's wall time."""
    import os

    from benchmarks.common import cores_during, cpu_s

    me = os.getpid()
    before = cpu_s({0: me, 1: 2**22 + 7})  # a pid that does not exist is left out
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    after = cpu_s({0: me})
    assert set(before) == {0} and after[0] >= before[0] + 0.03
    split = cores_during((1.0, {0: 2.0, 1: 5.0}), (1.5, {0: 3.0, 1: 5.5}), 2.0)
    assert split == {
        "controller_and_client": 0.25,
        "agents": {0: 0.5, 1: 0.25},
        "agents_total": 0.75,
    }
