"""The measures the new paper figures read off a simulation (benchmarks/paper): a throughput
ramp's time to a share of its peak (λScale Fig. 10/11, BlitzScale Fig. 18) and FlexPipe
§9.3's stall recovery (a request over 1.5x the P25 latency starts a stall, the next one
within 1.2x ends it)."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "paper"))
sys.path.insert(1, str(Path(__file__).resolve().parents[2] / "benchmarks" / "paper" / "flexpipe"))

from flexpipe_figs import recovery_s
from ramp import time_to_share, token_rate

from surge.sim.result import SimResult
from surge.traces.request import make_trace


def _result(first: list[float], done: list[float], out: list[int]) -> SimResult:
    n = len(first)
    return SimResult(
        "x",
        ("m",),
        np.zeros(n),
        np.array(first),
        np.array(done),
        np.array(out),
        np.zeros(n, dtype=np.int64),
    )


def test_token_rate_spreads_decode_and_counts_prompts_at_first_token() -> None:
    trace = make_trace("t", np.zeros(2), np.array([100, 300]), np.array([10, 10]))
    res = _result([0.0, 1.0], [1.0, 2.0], [10, 10])
    _times, rate = token_rate(res, trace, 0.5, 2.0)
    assert np.allclose(rate, [10, 10, 10, 10])  # 10 tokens over 1 s each, back to back
    _, prompt = token_rate(res, trace, 0.5, 2.0, prefill=True)
    assert np.allclose(prompt * 0.5, [100, 0, 300, 0])


def test_time_to_share_of_own_peak_or_a_reference() -> None:
    times = np.arange(6) * 1.0
    rate = np.array([0, 1, 2, 8, 10, 10], dtype=float)
    assert time_to_share(times, rate, 0.8) == 3.0
    assert time_to_share(times, rate, 0.8, reference=20.0) is None  # never 16
    assert time_to_share(times, rate, 0.5, reference=4.0) == 2.0
    assert time_to_share(times, np.zeros(6), 0.8) is None
    # a one-bin spike does not end the ramp once averaged
    spiky = np.array([0, 40, 0, 10, 10, 10], dtype=float)
    assert time_to_share(times, spiky, 0.8) == 1.0
    assert time_to_share(times, spiky, 0.8, window_bins=3) != 1.0


def test_stall_recovery_follows_the_papers_thresholds() -> None:
    arrival = np.arange(10) * 0.1
    # P25 latency 1.0: 1.6 starts a stall (> 1.5), 1.3 does not end it (> 1.2), 1.1 does
    latency = np.array([1.0, 1.0, 1.0, 1.6, 2.0, 1.3, 1.1, 1.0, 1.0, 1.0])
    assert np.allclose(recovery_s(arrival, latency), [0.3])
    assert recovery_s(arrival, np.ones(10)) == []
    # order by arrival, whatever order the requests come in
    shuffled = np.array([9, 3, 0, 6, 1, 4, 2, 8, 5, 7])
    assert np.allclose(recovery_s(arrival[shuffled], latency[shuffled]), [0.3])
