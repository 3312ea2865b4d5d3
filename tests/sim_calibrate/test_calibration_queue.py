"""Calibration fix 15: the transfers' wake-ups queue behind serving threads that fill the
cores (`TestbedHost.transfer_wakeups_queue`, `compute_sharing.queued_flow_speed`), and
its check (`benchmarks/sim_calibrate/wakeup_queue.py`)."""

import itertools
import json
import os
import time
from pathlib import Path

import pytest

from benchmarks.sim_calibrate.compute_sharing import ComputeSharing, queued_flow_speed
from benchmarks.sim_calibrate.predict import predict
from benchmarks.sim_calibrate.repeats import SCENARIOS, bursts_of, scenario_name
from benchmarks.sim_calibrate.rounds import profile_of, rounds_of
from benchmarks.sim_calibrate.testbed import TestbedHost
from benchmarks.sim_calibrate.wakeup_queue import loop_schedstat, median_queue, model_of, summarize
from surge.errors import SurgeError
from surge.sim.events import EventLoop
from surge.sim.flows import FlowNetwork
from tests.sim_calibrate.test_serving_transfers import BusyEndpoint

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "benchmarks" / "sim_calibrate" / "recorded" / "sim_calibration_repeats_fix12.json"


def test_flows_slow_only_once_serving_and_transfers_want_more_than_the_cores():
    assert queued_flow_speed(2.0, 1, 0.7, 0.1) == 1.0  # a core free for the wake-ups
    assert queued_flow_speed(2.0, 2, 0.0, 0.1) == 1.0  # no transfer CPU runnable
    # 5 serving threads + 1.4 cores of wake-ups on 2 cores: s = 2 / 6.4, a block's CPU
    # (0.1 cores at the link's rate) waits 1/s - 1 = 2.2 times its length.
    assert queued_flow_speed(2.0, 5, 1.4, 0.1) == pytest.approx(1 / (1 + 0.1 * 2.2))
    speeds = [queued_flow_speed(2.0, b, 1.0, 0.1) for b in range(1, 7)]
    assert speeds[0] == 1.0 and all(x > y for x, y in itertools.pairwise(speeds))
    assert queued_flow_speed(2.0, 5, 1.4, 0.0) == 1.0  # transfers without CPU never wait


def _sharing(queue: bool) -> tuple[ComputeSharing, FlowNetwork]:
    net = FlowNetwork(EventLoop())
    sharing = ComputeSharing(net, 2.0, 0.1, transfers_first=True, wakeups=True, wakeups_queue=queue)
    return sharing, net


@pytest.mark.parametrize("queue", [False, True])
def test_busy_pipelines_slow_the_flows_only_with_the_queue(queue):
    sharing, net = _sharing(queue)
    for i in range(2):  # the K=2 hot sources
        sharing.on_busy(BusyEndpoint(i, (i,), 1.0))
    sharing.on_transfers(+6)
    two = queued_flow_speed(2.0, 2, 0.6, 0.1) if queue else 1.0
    assert net.speed == pytest.approx(two)
    for i in range(2, 5):  # three pipelines serving on the receivers
        sharing.on_busy(BusyEndpoint(i, (i,), 1.0))
    five = queued_flow_speed(2.0, 5, 0.6, 0.1) if queue else 1.0
    assert net.speed == pytest.approx(five)
    assert (net.speed < 0.9) == queue
    for i in range(2, 5):
        pipe = BusyEndpoint(i, (i,), 1.0)
        pipe.busy = False
        sharing.on_busy(pipe)
    assert net.speed == pytest.approx(two)
    sharing.on_transfers(-6)
    assert sharing.flow_speed() == 1.0


def test_the_queue_needs_transfer_wakeups():
    with pytest.raises(SurgeError, match="transfer_wakeups_queue"):
        TestbedHost(shared_cores=2.0, transfers_first=True,
            transfer_wakeups_queue=True,
        )  # fmt: skip
    TestbedHost(shared_cores=2.0, transfers_first=True,
        transfer_wakeups=True, transfer_wakeups_queue=True,
    )  # fmt: skip


def _recorded() -> tuple[dict, dict]:
    old = json.loads(RECORDED.read_text())
    bursts = bursts_of(old, [])
    reals = {
        k: {key: v for key, v in bursts[0][scenario_name(k, m)].items() if key != "modes"}
        for k, m in SCENARIOS
    }
    return profile_of(rounds_of(old), reals[1]), reals


def test_fix_15_stretches_the_k2_execute_while_load_multicast_and_not_k1_stop_the_world():
    profile, reals = _recorded()
    got = predict(profile, reals, 2.0)
    ewl = got[scenario_name(2, "execute_while_load")]
    # Its pipelines serve on the receivers: the multicast ends later, the p90 rises.
    assert ewl["predicted"]["multicast_complete_s"] > 1.15
    by_fix = ewl["predicted_by_fix"]
    assert by_fix["15_wakeups_queue"]["ttft_p90_s"] > by_fix["14_serving_efficiency"]["ttft_p90_s"]
    # One hot source and no pipelines: a core stays free for the wake-ups.
    k1 = got[scenario_name(1, "stop_the_world")]["predicted_by_fix"]
    assert k1["15_wakeups_queue"] == k1["14_serving_efficiency"]


def _run(window: float, loop: float, wait: float) -> dict:
    return {
        "window_s": window,
        "receivers_loop_cores": loop,
        "receivers_loop_share": round(loop / (loop + wait), 4),
    }


def test_the_queue_summary_sets_the_measured_beside_the_model():
    pair = {"served": _run(1.4, 0.4, 1.2), "hot_only": _run(1.2, 0.5, 0.5)}
    got = summarize([pair, pair], 5, 2.0, 0.1)
    row = got["ratios"][0]
    assert row["multicast_ratio"] == pytest.approx(1.4 / 1.2, abs=1e-4)
    model = model_of(pair["hot_only"], 5, 2.0, 0.1)
    expected = queued_flow_speed(2.0, 2, 0.5, 0.1) / queued_flow_speed(2.0, 5, 0.5, 0.1)
    assert row["model_multicast_ratio"] == pytest.approx(expected, abs=1e-4)
    assert model["loop_share_served"] == pytest.approx(2.0 / 5.5, abs=1e-4)
    assert row["loop_share_served"] == 0.25 and row["loop_share_hot_only"] == 0.5
    assert median_queue([{"engine": {}}]) is None
    assert median_queue([{"queue": got}, {"engine": {}}]) == got["median"]
    profile, reals = _recorded()
    assert profile["wakeups_queue_check"] is None
    rounds = rounds_of(json.loads(RECORDED.read_text()))
    assert profile_of([*rounds, {"queue": got}], reals[1])["wakeups_queue_check"] == got["median"]


def test_loop_schedstat_counts_this_main_thread():
    cpu0, _, slices0 = loop_schedstat(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    cpu1, wait1, slices1 = loop_schedstat(os.getpid())
    assert cpu1 - cpu0 >= 0.04 and wait1 >= 0 and slices1 >= slices0


STUB = {
    "transfer_cores_serving": {"1": 0.09, "2": 0.1},  # per K, as the contention step's
    "transfer_cores": 0.2,
    "send_cpu_s_per_gb": 0.5,
}


def test_a_failed_queue_check_does_not_end_the_round(monkeypatch):
    import benchmarks.sim_calibrate.rounds as rounds_mod

    names = (
        "measure_engine", "measure_transport", "measure_endpoint_open", "measure_send_cost",
        "measure_pipeline_serving", "measure_multicast_while_serving",
        "measure_receive_while_serving", "measure_serving_during_multicast",
    )  # fmt: skip
    for name in names:
        monkeypatch.setattr(rounds_mod, name, lambda *a, **k: dict(STUB))
    seen = []

    def failing(*args):
        seen.append(args)
        raise RuntimeError("the multicast of c0 did not complete")

    monkeypatch.setattr(rounds_mod, "measure_queue", failing)
    real = {"blocks": 16}
    got = rounds_mod.measure_round(64, real, 1, 3)
    assert "did not complete" in got["queue"]["error"] and seen[0][4] == 0.1
    assert got["engine"] == STUB
    assert median_queue([got]) is None
    recorded = rounds_of(json.loads(RECORDED.read_text()))[0]
    assert rounds_mod.queue_transfer_cores(recorded) == 0.1014  # its K=2 contention
    assert rounds_mod.queue_transfer_cores({"transport": {"transfer_cores": 0.2}}) == 0.2

    def engine_fails(*args):
        raise RuntimeError("engine")

    monkeypatch.setattr(rounds_mod, "measure_engine", engine_fails)
    with pytest.raises(RuntimeError, match="engine"):
        rounds_mod.measure_round(64, real, 1, 3)
