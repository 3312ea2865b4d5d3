"""Calibration fix 11: blocks into a serving agent at their MEASURED slow-down
(`TestbedHost.serving_receive_slowdown`, `compute_sharing.py`;
`benchmarks/sim_calibrate/receive.py`, `rounds.profile_of`,
`predict.predict`)."""

import json
from pathlib import Path

import pytest

from benchmarks.sim_calibrate.compute_sharing import ComputeSharing
from benchmarks.sim_calibrate.predict import predict
from benchmarks.sim_calibrate.receive import chain_plan, median_receive, receive_seconds
from benchmarks.sim_calibrate.repeats import SCENARIOS, bursts_of, scenario_name
from benchmarks.sim_calibrate.rounds import profile_of, rounds_of
from benchmarks.sim_calibrate.testbed import TestbedHost
from surge.errors import SurgeError
from surge.sim.events import EventLoop
from surge.sim.flows import FlowNetwork
from tests.sim_calibrate.test_serving_transfers import BusyEndpoint

ROOT = Path(__file__).resolve().parents[2]
RECORDED = (
    ROOT / "benchmarks" / "sim_calibrate" / "recorded" / "sim_calibration_repeats_fused_store.json"
)


def _sharing(slowdown: float) -> tuple[ComputeSharing, dict]:
    net = FlowNetwork(EventLoop())
    links = {g: (net.add_link(f"out/{g}", 1.0), net.add_link(f"in/{g}", 1.0)) for g in (0, 1)}
    sharing = ComputeSharing(
        net, 1.0, 0.3, transfers_first=True,
        links_of_gpu=lambda g: ((links[g][0],), (links[g][1],)), send_cpu_cores=0.1,
        receive_slowdown=slowdown,
    )  # fmt: skip
    return sharing, links


@pytest.mark.parametrize("slowdown", [1.0, 2.5])
def test_a_serving_node_receives_at_the_measured_slowdown_and_sends_at_its_share(slowdown):
    sharing, links = _sharing(slowdown)
    sharing.on_busy(BusyEndpoint(7, (0,), 1.0))
    sharing.on_busy(BusyEndpoint(8, (1,), 1.0))  # share 0.5: fix 9 would receive at 1 / 1.2
    out, into = links[0]
    assert out.speed == pytest.approx(1 / (1 + 0.1))  # the sender's end: fix 9's formula
    assert into.speed == pytest.approx(1 / slowdown)  # the receiver's: measured
    plain, plain_links = _sharing(0.0)
    plain.on_busy(BusyEndpoint(7, (0,), 1.0))
    plain.on_busy(BusyEndpoint(8, (1,), 1.0))
    assert plain_links[0][1].speed == pytest.approx(1 / 1.2)  # 0 = fix 9 unchanged


def test_an_idle_node_receives_at_full_speed_whatever_the_slowdown():
    sharing, links = _sharing(3.0)
    busy = BusyEndpoint(7, (0,), 1.0)
    sharing.on_busy(busy)
    assert links[0][1].speed == pytest.approx(1 / 3.0)
    assert links[1][1].speed == 1.0  # node 1 serves nothing
    busy.busy = False
    sharing.on_busy(busy)
    assert links[0][1].speed == 1.0


def test_settings_checked():
    base = dict(shared_cores=2.0, transfers_first=True)
    with pytest.raises(SurgeError, match="0 \\(off\\) or >= 1"):
        TestbedHost(serving_receive_slowdown=0.9, **base)
    with pytest.raises(SurgeError, match="needs serving_transfers_shared"):
        TestbedHost(serving_receive_slowdown=1.5, **base)
    TestbedHost(serving_transfers_shared=True,
        serving_receive_slowdown=1.5, **base,
    )  # fmt: skip


def test_the_two_chains_feed_each_receiver_every_block_from_alternating_senders():
    for first in (True, False):
        plan = chain_plan(4, first)
        assert len(plan.steps) == 4  # one block per link per step: the cap's pace
        into_serving = {tr.src for step in plan.steps for tr in step if tr.dst == 2}
        assert into_serving == {0 if first else 1}
        assert sorted(tr.block for step in plan.steps for tr in step if tr.dst == 3) == [
            0,
            1,
            2,
            3,
        ]
    arrival = [[0.0] * 3, [0.0] * 3, [0.2, 0.5, 1.2], [0.3, 0.9, 1.0]]
    assert receive_seconds(arrival) == (1.2, 1.0)


def test_median_receive_over_every_pair_of_every_round():
    rounds = [
        {"receive": {"pairs": [{"ratio": 1.0}, {"ratio": 1.3}]}},
        {"receive": {"pairs": [{"ratio": 0.9}]}},
        {"engine": {}},
    ]
    assert median_receive(rounds) == 1.0
    assert median_receive([{"engine": {}}]) is None


def _recorded() -> tuple[list[dict], dict]:
    old = json.loads(RECORDED.read_text())
    bursts = bursts_of(old, [])
    reals = {
        k: {key: v for key, v in bursts[0][scenario_name(k, m)].items() if key != "modes"}
        for k, m in SCENARIOS
    }
    return rounds_of(old), reals


def _receive(*ratios: float) -> dict:
    return {"receive": {"pairs": [{"ratio": r} for r in ratios]}}


def test_receive_only_rounds_add_fix_11_and_a_ratio_under_1_is_no_slowdown():
    rounds, reals = _recorded()
    plain = profile_of(rounds, reals[1])
    assert plain["serving_receive_slowdown"] is None
    got = profile_of([*rounds, _receive(0.97, 0.99, 1.03)], reals[1])
    assert got["serving_receive_slowdown_measured"] == pytest.approx(0.99)
    assert got["serving_receive_slowdown"] == 1.0
    slow = profile_of([*rounds, _receive(1.4, 1.6)], reals[1])
    assert slow["serving_receive_slowdown"] == pytest.approx(1.5)
    for key in ("transfer_cores", "pipeline_speed", "send_cpu_cores", "transfer_cores_serving"):
        assert got[key] == plain[key], key


def test_fix_11_is_fix_10_without_the_measurement_and_moves_the_k2_pipelines_multicast():
    rounds, reals = _recorded()
    profile = profile_of(rounds, reals[1])
    plain = predict(profile, reals, 2.0)
    for row in plain.values():
        by_fix = row["predicted_by_fix"]
        assert by_fix["11_serving_receive"] == by_fix["10_transfer_cpu_serving"]
    name = scenario_name(2, "execute_while_load")
    ends = {
        r: predict(profile | {"serving_receive_slowdown": r}, reals, 2.0)[name]["predicted"][
            "multicast_complete_s"
        ]
        for r in (1.0, 3.0)
    }
    fix_10 = plain[name]["predicted"]["multicast_complete_s"]
    # Pipeline stages receive while they serve: at full speed the multicast ends before
    # fix 9's share formula has it end, and 3x slower receiving ends it later still.
    assert ends[1.0] < fix_10 < ends[3.0]
    stw = scenario_name(2, "stop_the_world")  # no receiver serves: nothing changes
    assert (
        predict(profile | {"serving_receive_slowdown": 3.0}, reals, 2.0)[stw]["predicted"]
        == plain[stw]["predicted"]
    )
