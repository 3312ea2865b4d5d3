"""Repeated runtime bursts for `benchmarks/sim_calibrate/main.py`: schedule, runs, statistics.

One burst per scenario is one sample of a noisy process (two quiet `--run-real` runs 35
minutes apart on the same code: K=1 stop-the-world p90 3.40 s, then 2.34 s). So the
calibration runs every scenario `repeats` times, interleaved: repeat r runs the four
scenarios in an order rotated by r (machine load drifting over the run hits them alike),
then one round of the profile measurements (`measure_round`). What it compares is the
simulator against the MEDIAN of the runtime's percentiles, beside the runtime's own spread.

In: the repeat count, the burst's settings (`BurstSettings`), a profile round callback.
Out: per repeat, each scenario's `scale_burst` report (every raw number) and the profile
round; the pure statistics below (`rotated_order`, `spread`, `measured_summary`,
`relative_errors`, `paired_errors`) turn them into the calibration's rows.
"""

import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("sim_calibrate")

MODES = ("execute_while_load", "stop_the_world")
SOURCES = (1, 2)
SCENARIOS: tuple[tuple[int, str], ...] = tuple((k, m) for k in SOURCES for m in MODES)
"""(K hot instances, mode): the four bursts `benchmarks/scaleout/scale_burst.py` runs."""
PERCENTILES = ("ttft_p50_s", "ttft_p90_s")


def scenario_name(k: int, mode: str) -> str:
    return f"K={k}/{mode}"


def rotated_order(scenarios: tuple, repeat: int) -> list:
    """Repeat `repeat`'s scenario order: `scenarios` rotated left by `repeat`, so over
    len(scenarios) repeats every scenario runs once in every position."""
    i = repeat % len(scenarios)
    return list(scenarios[i:]) + list(scenarios[:i])


def spread(values: list[float]) -> dict:
    """Median, min and max of one percentile over the repeats, and min/max relative to the
    median (the runtime's own run-to-run noise, beside the simulator's error)."""
    if not values:
        raise ValueError("no repeats")
    med = statistics.median(values)
    return {
        "median": round(med, 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "min_vs_median": round(min(values) / med - 1, 4),
        "max_vs_median": round(max(values) / med - 1, 4),
        "by_repeat": [round(v, 4) for v in values],
    }


def measured_summary(bursts: list[dict]) -> dict:
    """Per percentile, the `spread` of one scenario's bursts (one report per repeat)."""
    return {q: spread([b[q] for b in bursts]) for q in PERCENTILES}


def relative_errors(predicted: dict, measured: dict) -> dict:
    """Per percentile, predicted / the runtime's median - 1 (`measured` as `measured_summary`)."""
    return {q: round(predicted[q] / measured[q]["median"] - 1, 4) for q in PERCENTILES}


def paired_errors(predicted: list[dict], bursts: list[dict]) -> dict:
    """Per percentile, each repeat's prediction (from that repeat's own profile) against
    that repeat's burst, and their median: whether pairing a burst with the profile
    measured beside it tracks the machine's drift."""
    if len(predicted) != len(bursts):
        raise ValueError("one prediction per repeat")
    out = {}
    for q in PERCENTILES:
        errs = [round(p[q] / b[q] - 1, 4) for p, b in zip(predicted, bursts, strict=True)]
        out[q] = {"median": round(statistics.median(errs), 4), "by_repeat": errs}
    return out


def bursts_of(old: dict, committed: list[dict]) -> list[dict]:
    """A calibration's bursts, one dict per repeat: its raw `bursts`, or (older JSONs, one
    burst per scenario) each scenario's measured percentiles on the committed bursts'
    settings (`committed`: one repeat, as `main.committed_bursts`)."""
    if "bursts" in old:
        return old["bursts"]
    rows = old.get("scenarios", {})
    missing = [scenario_name(k, m) for k, m in SCENARIOS if scenario_name(k, m) not in rows]
    if missing:
        raise ValueError(f"it has no {', '.join(missing)}")
    out = {}
    for k, mode in SCENARIOS:
        name = scenario_name(k, mode)
        settings = {key: v for key, v in committed[0][name].items() if key != "modes"}
        out[name] = settings | {"modes": {mode: rows[name]["measured"]}}
    return [out]


def cpu_times() -> list[int]:
    """This machine's CPU time counters (/proc/stat `cpu` line: user nice system idle
    iowait irq softirq steal ...), in clock ticks."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def own_cpu_s() -> float:
    """CPU seconds of this process and its reaped descendants (a burst's `scale_burst`
    process and its agents, a profile round's clusters)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def cpu_shares(before: list[int], after: list[int], own_s: float, hz: float, cpus: int) -> dict:
    """Shares of the machine's CPU time between two `cpu_times` samples: busy (all but idle
    and iowait), idle, steal (taken by other VMs on the host), and the cores everyone else
    used on average (busy seconds less `own_s`, this run's): the load the run competed with;
    and the cores this run used (`own_s` over the window)."""
    d = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(d) or 1
    idle = d[3] + d[4]
    others_s = max((total - idle) / hz - own_s, 0.0)
    return {
        "busy": round(1 - idle / total, 3),
        "idle": round(idle / total, 3),
        "steal": round(d[7] / total, 3),
        "others_cores": round(others_s / (total / hz) * cpus, 3),
        "own_cores": round(own_s / (total / hz) * cpus, 3),
    }


@dataclass(frozen=True)
class BurstSettings:
    """What every burst runs with (`benchmarks/scaleout/scale_burst.py` options)."""

    model_mb: float = 64.0
    requests: int = 64
    timeout_s: float = 600.0


def run_burst(k: int, mode: str, settings: BurstSettings) -> dict:
    """One scenario in a fresh `scale_burst` process: its report (settings + one mode)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "burst.json"
        cmd = [sys.executable, "-m", "benchmarks.scaleout.scale_burst", "--sources", str(k)]
        cmd += ["--modes", mode, "--no-cold-start", "--model-mb", str(settings.model_mb)]
        cmd += ["--requests", str(settings.requests), "--json", str(out)]
        done = subprocess.run(cmd, timeout=settings.timeout_s, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"scale_burst K={k} {mode} failed: {done.stderr[-2000:]}")
        return json.loads(out.read_text())


def run_interleaved(
    repeats: int,
    settings: BurstSettings,
    measure_round: Callable[[int], dict] | None,
    burst: Callable[[int, str, BurstSettings], dict] = run_burst,
) -> tuple[list[dict], list[dict]]:
    """`repeats` x every scenario in rotated order, each repeat followed by a profile
    round. Returns (per repeat {scenario name: burst report}, per repeat the profile
    round); a log line per burst and per round (elapsed, ETA)."""
    bursts: list[dict] = []
    rounds: list[dict] = []
    steps = repeats * (len(SCENARIOS) + (measure_round is not None))
    done, start = 0, time.monotonic()

    def progress(what: str) -> None:
        elapsed = time.monotonic() - start
        eta = elapsed / done * (steps - done)
        log.info("[%d/%d] %s (%.0f s elapsed, ~%.0f s left)", done, steps, what, elapsed, eta)

    def sample() -> tuple[float, list[int], float]:
        return os.getloadavg()[0], cpu_times(), own_cpu_s()

    def machine_state(at: tuple[float, list[int], float]) -> dict:
        """The load average before, and the CPU shares during (the machine is shared)."""
        load, before, own = at
        hz, cpus = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
        shares = cpu_shares(before, cpu_times(), own_cpu_s() - own, hz, cpus)
        return {"load_average_1m": round(load, 2)} | shares

    for r in range(repeats):
        this: dict = {}
        for k, mode in rotated_order(SCENARIOS, r):
            at = sample()
            rep = burst(k, mode, settings)
            rep["machine_state"] = state = machine_state(at)
            this[scenario_name(k, mode)] = rep
            done += 1
            m = rep["modes"][mode]
            progress(
                f"repeat {r + 1}/{repeats} K={k} {mode}: TTFT p50 {m['ttft_p50_s']:.2f} s, "
                f"p90 {m['ttft_p90_s']:.2f} s; others used {state['others_cores']:.2f} cores"
            )
        bursts.append(this)
        if measure_round is not None:
            at = sample()
            rounds.append(measure_round(r))
            rounds[-1]["machine_state"] = state = machine_state(at)
            done += 1
            progress(
                f"repeat {r + 1}/{repeats} profile round; others used "
                f"{state['others_cores']:.2f} cores"
            )
    return bursts, rounds
