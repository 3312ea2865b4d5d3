"""Calibration fix 10: the transfer CPU measured while K hot instances serve
(`benchmarks/sim_calibrate/contention.py`, `rounds.profile_of`,
`predict.predict`)."""

import json
from pathlib import Path

import pytest

from benchmarks.sim_calibrate.contention import TransferShare, median_contention
from benchmarks.sim_calibrate.predict import predict
from benchmarks.sim_calibrate.repeats import SCENARIOS, bursts_of, scenario_name
from benchmarks.sim_calibrate.rounds import profile_of, rounds_of

ROOT = Path(__file__).resolve().parents[2]
RECORDED = (
    ROOT / "benchmarks" / "sim_calibrate" / "recorded" / "sim_calibration_repeats_fused_store.json"
)


def _contention(k1: float, k2: float) -> dict:
    return {
        "contention": {
            "transfer_cores_serving": {"1": k1, "2": k2},
            "multicast_s": {"1": 1.4, "2": 1.3},
        }
    }


def test_transfer_cpu_counts_the_non_serving_agents_less_their_idle_and_the_hot_sending() -> None:
    share = TransferShare(hot=1, transfers=10, sent_by_hot=4, block_bytes=4e6, block_s=0.064)
    cpu = {0: 0.9, 1: 0.05, 2: 0.07}  # agent 0 serves: its CPU is not the transfers'
    got = share.cpu_s_per_transfer(cpu, others_idle_cores=0.01, window_s=2.0, send_cpu_s_per_gb=0.5)
    # (0.05 + 0.07 - 0.01 x 2 s) + 0.5 CPU-s/GB x 4 blocks x 0.004 GB, over 10 transfers
    assert got == pytest.approx((0.12 - 0.02 + 0.008) / 10)
    busier = share.cpu_s_per_transfer(
        {**cpu, 0: 1.8}, others_idle_cores=0.01, window_s=2.0, send_cpu_s_per_gb=0.5
    )
    assert busier == pytest.approx(got)  # more serving CPU is not more transfer CPU


def test_contention_medians_per_k_and_over_every_k() -> None:
    rounds = [_contention(0.2, 0.3), _contention(0.1, 0.25), _contention(0.4, 0.2), {"x": 1}]
    med = median_contention(rounds)
    assert med["rounds"] == 3
    assert med["transfer_cores_serving"] == {"1": 0.2, "2": 0.25}
    assert med["transfer_cores_all_k"] == pytest.approx(0.225)  # of 0.1 0.2 0.2 0.25 0.3 0.4
    assert median_contention([{"x": 1}]) == {}


def _recorded() -> tuple[list[dict], dict]:
    old = json.loads(RECORDED.read_text())
    bursts = bursts_of(old, [])
    reals = {
        k: {key: v for key, v in bursts[0][scenario_name(k, m)].items() if key != "modes"}
        for k, m in SCENARIOS
    }
    return rounds_of(old), reals


def test_contention_only_rounds_add_fix_10_to_the_other_rounds_profile() -> None:
    rounds, reals = _recorded()
    plain = profile_of(rounds, reals[1])
    assert plain["transfer_cores_serving"] is None
    both = profile_of([*rounds, _contention(0.2, 0.22), _contention(0.24, 0.26)], reals[1])
    assert both["transfer_cores_serving"] == pytest.approx(0.23)
    for key in ("transfer_cores", "pipeline_speed", "send_cost_s_per_gb", "send_cpu_cores"):
        assert both[key] == plain[key], key  # the other rounds' numbers are untouched


def test_fix_10_is_fix_9_without_the_measurement_and_slower_with_more_transfer_cpu() -> None:
    rounds, reals = _recorded()
    plain = predict(profile_of(rounds, reals[1]), reals, 2.0)
    for row in plain.values():
        by_fix = row["predicted_by_fix"]
        assert by_fix["10_transfer_cpu_serving"] == by_fix["9_serving_transfers"]
    profile = profile_of(rounds, reals[1])
    more = profile["transfer_cores"] * 1.3
    busy = predict(profile | {"transfer_cores_serving": more}, reals, 2.0)
    for name, row in busy.items():
        before = plain[name]["predicted"]
        # More CPU per transfer: the hot sources serve slower while blocks move, so the
        # median request waits longer, in every scenario.
        assert row["predicted"]["ttft_p50_s"] > before["ttft_p50_s"], name
        assert (
            row["predicted_by_fix"]["9_serving_transfers"]
            == (plain[name]["predicted_by_fix"]["9_serving_transfers"])
        )
