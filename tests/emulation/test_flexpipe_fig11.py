"""FlexPipe Fig. 11 on the emulation (`benchmarks/emulation/flexpipe_fig11.py`): §9.3's stalls
read off the times the runtime stamped, the cell labelled with its setting and violations,
and the whole path on real agents: a burst past what one instance serves is a stall, the
calm after it its recovery."""

import argparse
from pathlib import Path

import pytest

from benchmarks.emulation.flexpipe_fig11 import emulated_stalls, stall_summary
from benchmarks.emulation.flexpipe_fig11_report import cells


def test_a_stall_starts_over_1_5x_p25_and_recovers_within_1_2x() -> None:
    arrival = [float(i) for i in range(10)]
    latency = [1.0, 1.0, 1.0, 2.0, 1.7, 1.1, 1.0, 1.0, 3.0, 1.0]
    st = stall_summary(arrival, latency)
    # two stalls: from 3 s to 5 s (1.7 is still over 1.2x) and from 8 s to 9 s
    assert st["stalls"] == 2
    assert st["recoveries_s"] == [2.0, 1.0]
    assert st["recovery_median_s"] == 1.5
    assert stall_summary(arrival, [1.0] * 10)["stalls"] == 0


def test_emulated_stalls_read_the_controllers_stamps_and_skip_unfinished() -> None:
    # request_timeline rows: arrival, routed, first token, second token, done, hops
    rows = [[float(i), i, i, i, i + 1.0, ["a"]] for i in range(6)]
    rows[2][4] = 2.0 + 3.0  # the third waited: a stall from 2 s, recovered at 3 s
    rows.append([6.0, None, None, None, None, []])  # never finished: not a latency
    st = emulated_stalls({"request_timeline": rows})
    assert st["stalls"] == 1 and st["recoveries_s"] == [1.0]
    assert len(st["requests"]) == 6


def _report(violations: int) -> dict:
    st = stall_summary([0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 1.0, 1.0])
    run = {"requests": 4, "stall_recovery": st, "load_average": [2.0, 1.0, 1.0]}
    run["emulation"] = {"steps": 100, "violations": violations, "violation_rate": violations / 100}
    return {
        "emulate": "flexpipe:llama2-7b",
        "nodes": 8,
        "time_dilation": 10.0,
        "cv": 4.0,
        "rate_qps": 2.0,
        "settings": {"duration": "60.0"},
        "machine": {"load_average_start": [1.5, 1.0, 1.0]},
        "emulated": {"flexpipe": run},
        "simulated": {"flexpipe": stall_summary([0.0, 1.0], [1.0, 1.0])},
    }


def test_the_cell_is_labelled_with_preset_gpus_dilation_and_violations() -> None:
    (cell,) = cells(_report(0))
    assert (cell["paper"], cell["figure"]) == ("FlexPipe", "Fig. 11")
    text = cell["emulated"]
    assert text.startswith("EMULATED (flexpipe:llama2-7b, 8 GPUs, D=10;")
    assert "0 of 100 steps violated" in text
    assert "load 1.5 at the start, 2.0-2.0 at the runs' ends" in text
    assert "FlexPipe 1000 ms (1)" in text and "sim same setting: FlexPipe no stall" in text
    assert "not the cluster's" not in text
    assert "not the cluster's" in cells(_report(2))[0]["emulated"]


@pytest.mark.timeout(600)
def test_a_burst_on_real_agents_is_a_stall_and_its_calm_the_recovery() -> None:
    """Two emulated agents, one instance held (ServerlessLLM, max one replica, two sequences
    at a time): calm requests, a burst of ten at once that queues, then calm again. The
    burst's latencies, stamped by the controller from the agents' paced steps, are a stall;
    the first calm request after it ends it. Every agent is stopped by its PID."""
    from benchmarks.emulation.serving import Workload, serve_workload
    from benchmarks.emulation.staging import emulated_cluster, fresh_copies, run_on_real_model
    from surge.emulation import EmulationConfig

    args = argparse.Namespace(
        nodes=2, max_num_seqs=2, layers=2, blocks=2, max_prompt=16, max_tokens=8,
        cluster="loopback", cpu_per_node=None, time_dilation=2.0,
    )  # fmt: skip
    calm = [0.0, 1.0, 2.0]
    burst = [3.0 + 0.01 * i for i in range(10)]  # apart: arrival order is well defined
    after = [10.0, 11.0, 12.0]
    arrivals = tuple(calm + burst + after)
    wl = Workload(arrivals, (16,) * len(arrivals), (8,) * len(arrivals))
    spec = {"name": "m", "strategy": "serverlessllm"}
    spec["autoscaling"] = {"min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 2}
    pids: list[int] = []

    async def run(tmp: Path, manifest, emulation) -> dict:
        cluster = emulated_cluster(args, tmp, emulation)
        with cluster:
            pids.extend(p.pid for p in cluster.procs.values())
            try:
                state, _ = await fresh_copies(cluster, tmp, "m", manifest, "t", [], [0, 1])
                spec["model"] = str(args.store)
                return await serve_workload(
                    cluster, state, emulation, spec, wl, 1, {"max_num_seqs": 2}
                )
            finally:
                for proc in cluster.procs.values():  # stopped by PID, whatever happened
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait(timeout=30)

    config = EmulationConfig.parse("flexpipe:llama2-7b", args.time_dilation)
    res, _ = run_on_real_model(args, config, lambda t, m, e: run(t, m, e))
    assert res["finished"] == len(arrivals)
    st = emulated_stalls(res)
    assert st["stalls"] >= 1
    # the burst's stall (from 3.0x s) ends at a calm request after it (10, 11 or 12 s)
    assert any(6.9 <= r <= 9.0 for r in st["recoveries_s"]), st["recoveries_s"]
    assert pids and all(_gone(pid) for pid in pids)


def _gone(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie the launcher has not reaped yet is gone too
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" in status.read_text()
