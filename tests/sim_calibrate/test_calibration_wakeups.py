"""Calibration fixes 12 and 13: the transfers' CPU as wake-ups holding whole cores
(`TestbedHost.transfer_wakeups`, `compute_sharing.wakeup_share`), its measurement
(`benchmarks/sim_calibrate/serving.py`), and the serving step fitted at the burst's shapes
(`measure.burst_shape_costs`)."""

import itertools
import json
import os
import time
from pathlib import Path

import pytest

from benchmarks.sim_calibrate.compute_sharing import ComputeSharing, cores_held, wakeup_share
from benchmarks.sim_calibrate.predict import predict
from benchmarks.sim_calibrate.profiling import burst_shape_costs
from benchmarks.sim_calibrate.repeats import SCENARIOS, bursts_of, scenario_name
from benchmarks.sim_calibrate.rounds import profile_of, rounds_of
from benchmarks.sim_calibrate.serving import (
    median_serving,
    model_cores,
    schedstat_s,
    steps_of,
    summarize,
)
from benchmarks.sim_calibrate.testbed import TestbedHost
from surge.errors import SurgeError
from surge.sim.events import EventLoop
from surge.sim.flows import FlowNetwork
from tests.sim_calibrate.test_serving_transfers import BusyEndpoint

ROOT = Path(__file__).resolve().parents[2]
RECORDED = (
    ROOT / "benchmarks" / "sim_calibrate" / "recorded" / "sim_calibration_repeats_quiet_fix11.json"
)


@pytest.mark.parametrize("demand", [0.0, 0.3, 0.8, 1.5])
@pytest.mark.parametrize("busy", [2, 3, 5])
def test_endpoints_that_fill_the_cores_get_the_fluid_share(busy, demand):
    # E[min(B, c - n)] = c - E[n] = c - a once B >= c: fix 12 changes nothing there.
    assert wakeup_share(2.0, busy, demand) == pytest.approx(min(1.0, (2.0 - demand) / busy))


def test_a_lone_endpoint_loses_part_of_its_core_though_the_host_has_room():
    # M/M/2 at a = 0.68: P0 = 1 / (1 + a + a^2 / (2 (1 - a/2))), P1 = a P0; the endpoint
    # runs whenever at most one core is held: P0 + P1 (the fluid model says 1.0).
    a = 0.68
    p0 = 1 / (1 + a + a * a / (2 * (1 - a / 2)))
    assert wakeup_share(2.0, 1, a) == pytest.approx(p0 * (1 + a))
    assert 0.8 < wakeup_share(2.0, 1, a) < 0.85
    shares = [wakeup_share(2.0, 1, d) for d in (0.0, 0.2, 0.6, 1.2, 1.9, 2.0, 3.0)]
    assert shares[0] == 1.0 and shares[-2:] == [0.0, 0.0]
    assert all(x > y for x, y in itertools.pairwise(shares[:-1]))
    # One core: an M/M/1 queue, idle 1 - a of the time.
    assert wakeup_share(1.0, 1, 0.3) == pytest.approx(0.7)
    assert sum(cores_held(1.2, 3)) < 1.0  # the rest: every core held


def _sharing(wakeups: bool) -> ComputeSharing:
    return ComputeSharing(
        FlowNetwork(EventLoop()), 2.0, 0.11, transfers_first=True, wakeups=wakeups
    )


@pytest.mark.parametrize("wakeups", [False, True])
def test_a_hot_source_shares_with_transfers_in_flight_only_under_wakeups(wakeups):
    sharing = _sharing(wakeups)
    hot = BusyEndpoint(0, (0,), 1.0)
    sharing.on_busy(hot)
    sharing.on_transfers(+6)
    expected = wakeup_share(2.0, 1, 6 * 0.11) if wakeups else 1.0
    assert hot.share == pytest.approx(expected)
    assert (hot.share < 0.9) == wakeups
    sharing.on_transfers(-6)
    assert hot.share == 1.0
    other = BusyEndpoint(1, (1,), 1.0)  # two busy on two cores: the fluid share either way
    sharing.on_busy(other)
    sharing.on_transfers(+4)
    assert hot.share == pytest.approx((2.0 - 0.44) / 2) and other.share == hot.share


def test_transfer_wakeups_needs_transfers_first():
    with pytest.raises(SurgeError, match="transfer_wakeups"):
        TestbedHost(shared_cores=2.0, transfer_wakeups=True)
    TestbedHost(shared_cores=2.0, transfers_first=True,
        transfer_wakeups=True,
    )  # fmt: skip


def _recorded() -> tuple[dict, dict]:
    old = json.loads(RECORDED.read_text())
    bursts = bursts_of(old, [])
    reals = {
        k: {key: v for key, v in bursts[0][scenario_name(k, m)].items() if key != "modes"}
        for k, m in SCENARIOS
    }
    return profile_of(rounds_of(old), reals[1]), reals


def test_fix_12_slows_the_lone_hot_source_and_leaves_two_hot_sources_alone():
    profile, reals = _recorded()
    got = predict(profile, reals, 2.0)
    for k, mode in SCENARIOS:
        by_fix = got[scenario_name(k, mode)]["predicted_by_fix"]
        before, after = by_fix["11_serving_receive"], by_fix["12_transfer_wakeups"]
        if k == 1:  # one busy endpoint on 2 cores: it loses part of its core
            assert after["ttft_p50_s"] > 1.1 * before["ttft_p50_s"]
        else:  # two busy on two cores: the fluid share, unchanged
            assert after == before


def test_fix_13_fits_at_the_burst_shapes_and_older_profiles_keep_fix_12():
    real = {"max_num_seqs": 4, "prompt_len": [4, 12]}
    # Decode 1 ms + 1 ms per sequence up to 4, batch 8 far below the line (concave);
    # prefill 1 ms + 0.1 ms per token up to 48 tokens, 64 tokens far above.
    engine = {
        "num_layers": 2,
        "agent_round_trip_per_step_s": 0.002,
        "prefill_points_s": [[t, 0.001 + 1e-4 * t] for t in (4, 16, 32, 48)] + [[64, 0.05]],
        "decode_points_s": [[b, 0.001 + 0.001 * b] for b in (1, 2, 3, 4)] + [[8, 0.006]],
        "per_layer_s": {"unchanged": 1.0},
    }
    got = burst_shape_costs(engine, real)
    assert got["decode_per_seq"] == pytest.approx(0.0005)  # per layer: 2 layers
    assert got["decode_fixed"] == pytest.approx(0.0005 + 0.001)  # + round trip / layers
    assert got["prefill_per_token"] == pytest.approx(5e-5)
    assert got["prefill_fixed"] == pytest.approx(0.0005 + 0.001)
    # Without two shapes of each kind: the run's own costs.
    assert burst_shape_costs(engine | {"decode_points_s": [[8, 0.006]]}, real) == {"unchanged": 1.0}
    profile, reals = _recorded()
    assert (
        profile["burst_shapes"]["per_layer_s"]["decode_per_seq"]
        > (profile["engine"]["per_layer_s"]["decode_per_seq"])
    )
    older = {k: v for k, v in profile.items() if k != "burst_shapes"}
    for row in predict(older, reals, 2.0).values():
        by_fix = row["predicted_by_fix"]
        assert by_fix["13_burst_shape_fit"] == by_fix["12_transfer_wakeups"]


def test_steps_group_back_to_back_token_events():
    times = [0.0, 0.0001, 0.0003, 0.010, 0.0102, 0.030]
    assert [len(s) for s in steps_of(times)] == [3, 2, 1]
    assert [len(s) for s in steps_of(list(reversed(times)))] == [3, 2, 1]


def test_schedstat_counts_this_process_cpu():
    cpu0, _ = schedstat_s(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    cpu1, wait1 = schedstat_s(os.getpid())
    assert cpu1 - cpu0 >= 0.04 and wait1 >= 0


def test_the_serving_summary_compares_the_model_with_the_measured_cores():
    run = {"tokens_per_s": 400.0, "cores": 1.0, "others_cores": 0.0, "controller_cores": 0.02}
    pair = {
        "multicast": run | {"tokens_per_s": 280.0, "cores": 0.84, "others_cores": 0.6},
        "alone": run,
    }
    got = summarize([pair, pair], 2.0)
    ratio = got["ratios"][0]
    assert ratio["tokens_per_s_ratio"] == pytest.approx(0.7)
    assert ratio["cores_ratio"] == pytest.approx(0.84)
    assert ratio["model_hot_cores"] == pytest.approx(model_cores(1.0, 0.6, 2.0), abs=1e-4)
    assert ratio["model_hot_cores"] == pytest.approx(wakeup_share(2.0, 1, 0.6), abs=1e-4)
    assert ratio["model_hot_cores_with_controller"] < ratio["model_hot_cores"]
    assert median_serving([{"engine": {}}]) is None
    assert median_serving([{"serving": got}, {"engine": {}}]) == got["median"]


def test_fix_14_serves_at_the_measured_efficiency_only_while_transfers_run():
    sharing = ComputeSharing(FlowNetwork(EventLoop()), 2.0, 0.11, efficiency_in_transfers=0.8)
    hot = BusyEndpoint(0, (0,), 1.0)
    sharing.on_busy(hot)
    assert hot.share == 1.0
    sharing.on_transfers(+2)
    assert hot.share == pytest.approx(0.8)
    sharing.on_transfers(-2)
    assert hot.share == 1.0
    with pytest.raises(SurgeError, match="serving_efficiency_in_transfers"):
        TestbedHost(serving_efficiency_in_transfers=0.9)


def test_fix_14_takes_the_engine_threads_tokens_per_cpu_second_and_caps_it_at_1():
    alone = {"tokens_per_s": 400.0, "cores": 1.0, "event_loop_cores": 0.05}
    alone |= {"others_cores": 0.0, "controller_cores": 0.02}
    slower = alone | {"tokens_per_s": 270.0, "cores": 0.8, "event_loop_cores": 0.08}
    slower |= {"others_cores": 0.5}
    got = summarize([{"multicast": slower, "alone": alone}], 2.0)
    assert got["ratios"][0]["step_efficiency"] == pytest.approx((270 / 0.72) / (400 / 0.95), 1e-3)
    profile, reals = _recorded()
    rounds = rounds_of(json.loads(RECORDED.read_text()))
    with_it = profile_of([*rounds, {"serving": got}], reals[1])
    assert with_it["serving_efficiency_in_transfers"] == pytest.approx(0.8906, abs=1e-3)
    faster = summarize([{"multicast": alone | {"others_cores": 0.5}, "alone": slower}], 2.0)
    assert (
        profile_of([*rounds, {"serving": faster}], reals[1])["serving_efficiency_in_transfers"]
        == 1.0
    )
    assert profile["serving_efficiency_in_transfers"] is None
    k1 = scenario_name(1, "execute_while_load")
    by_fix = predict(with_it, reals, 2.0)[k1]["predicted_by_fix"]
    assert (
        by_fix["14_serving_efficiency"]["ttft_p50_s"] > by_fix["13_burst_shape_fit"]["ttft_p50_s"]
    )
    plain = predict(profile, reals, 2.0)[k1]["predicted_by_fix"]
    assert plain["14_serving_efficiency"] == plain["13_burst_shape_fit"]
