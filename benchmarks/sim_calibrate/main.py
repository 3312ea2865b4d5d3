"""Calibrate the simulator from this machine and predict `benchmarks/scaleout/scale_burst.py`.

1. Serving step as the real system runs it: `LLMEngine.step()` (scheduler + `ModelRunner`
   + sampler; CPU, one thread, as each agent runs) on the burst's model shape at its
   batch sizes (1-4 prompts of 4-12 tokens, then decode), fitted as per-layer linear
   models, plus the agent round trip per step (the burst through a 1-node
   `LocalCluster` minus the same burst in process, per step), added to the fixed costs
   and used as the pipeline stage hop.
2. Transport: one block between two agents at the cap (`--link-gbps`), and the whole
   multicast to the 8 agents (K=1 and K=2, no serving): the effective per-link rate
   (planned block steps at the cap / measured end) and the agents' CPU per block
   transfer (framing, receive, crc32 verify) -> `TestbedHost.transfer_cores`.
3. Endpoint opening: the controller's seconds to open one local instance / one execution
   pipeline while the burst is served (`measure.measure_endpoint_open`),
   as CPU seconds of the controller and the opened agents (cores-free seconds) ->
   `TestbedHost.endpoint_open_s`, `pipeline_open_s` (the simulator opens a multicast's
   endpoints one after another, as the runtime's carrier does: `sim/carrier.py`).
4. Writes that as a simulator profile (an inline GPU profile with
   `measured_layer_costs_s`, a model file of the burst's shape, an 8-node cluster file
   at the effective rate) and runs `surge.sim` on the burst: K warm instances, 64
   requests at t=0, binomial multicast with K sources, batch limit 4, pipelines of 2
   micro-batch groups (as `PipelineEndpoint`), modes execute_while_load (λScale
   pipelines) and stop_the_world (load-then-serve). The 8 agents share the machine's 2
   cores (`TestbedHost.shared_cores`), transfers included. One profile serves both modes
   and both K.
5. Pipeline speed: an execution pipeline's throughput vs a local instance on one burst,
   in the runtime and in the model (`sim_calibrate/pipeline.py`); their ratio ->
   `SimSettings.pipeline_speed`.
6. Sending while serving: the serving rate a source's agent loses per GB/s it sends
   (`sim_calibrate/send.py`: the burst served with and without the agent sending the
   model at the cap; its CPU seconds per GB sent alongside) ->
   `TestbedHost.send_cost_s_per_gb`.
7. Transfers first: block transfers take their CPU ahead of serving
   (`TestbedHost.transfers_first`; the agents moving blocks are I/O-bound, and Linux runs a
   task waking from I/O ahead of CPU-bound ones; measured, the runtime's multicast barely
   slows while hot instances serve). No parameter: fix 8 switches it on.
   Fix 9 (`TestbedHost.serving_transfers_shared`): an agent that also serves is CPU-bound,
   so its end of a transfer runs at its serving share (the sender's part of the transfer
   CPU, `send_cpu_cores`, from step 6's CPU seconds per GB sent; the receiver's the rest).
   Fix 10 (`sim_calibrate/contention.py`): step 2's transfer CPU is measured on a host
   where nothing serves; the profile round also runs the scale-out's multicast while K
   hot instances serve a burst (K = 1, 2: the burst's conditions up to its first opening)
   and takes the non-serving agents' CPU (less their idle CPU) plus the hot agents'
   sending per block transfer -> `transfer_cores_serving` (median over rounds and K),
   which replaces `transfer_cores` in fix 10 (without that measurement fix 10 is fix 9).
   Fix 11 (`sim_calibrate/receive.py`): fix 9 ASSUMES a serving agent receives blocks at
   its CPU share; the profile round times the same blocks into a serving agent and into an
   idle one at once while two hot instances saturate the host -> their ratio
   `serving_receive_slowdown` (median over the pairs, at least 1), which replaces fix 9's
   receiving end (`TestbedHost.serving_receive_slowdown`; without it fix 11 is fix 10).
   Fix 12 (`TestbedHost.transfer_wakeups`): the transfers' CPU as wake-ups that hold whole
   cores (an M/M/c queue's busy servers), the busy endpoints on the cores left: a lone hot
   source loses part of its core though the host has room (no new parameter: the transfer
   CPU of fix 10); the profile round checks it (`sim_calibrate/serving.py`: the K=1 hot
   agent with and without a multicast, its cores and run-queue wait, against the model's
   cores from the others' measured CPU). Fix 13: the serving step's costs fitted at the
   burst's shapes only (`profiling.burst_shape_costs`: decode batches up to
   the batch limit), and the pipeline speed against that model. Fix 15
   (`TestbedHost.transfer_wakeups_queue`): when serving threads and the transfers' CPU want
   more than the cores, the wake-ups queue with the serving threads and the flows slow (no
   new parameter); the round checks it (`sim_calibrate/wakeup_queue.py`: the K=2 multicast with
   and without pipelines serving on its receivers, their event loops' run-queue wait).
8. Compares predicted vs measured TTFT p50/p90 and writes
   `benchmarks/results/sim_calibrate/sim_calibration.json`, with the prediction after each fix.
   `--run-real` runs the runtime's four bursts (K=1, 2 x both modes) `--repeats` times,
   interleaved with as many profile rounds (`sim_calibrate/repeats.py`): the simulator runs
   on the MEDIAN profile and is compared with the MEDIAN of the runtime's percentiles, each
   beside the runtime's spread (min/max over the repeats); each repeat's own profile
   against its own bursts is reported too (`paired_by_repeat`). Without `--run-real`: the
   bursts of `--bursts JSON..` (previous calibrations, each its repeats) or the committed
   `benchmarks/results/scaleout/scale_burst*.json` (one sample each).

Why the median profile for the headline: the profile rounds are measured minutes away
from the bursts they would be paired with, so a round shares only slow drift with "its"
bursts, and one round is as noisy as one burst (two quiet runs: `pipeline_speed` 1.03 vs
0.77); the medians of both sides estimate the same quiet-machine quantities. Whether pairing
tracks drift better is measured, not assumed: `paired_by_repeat`.

The measurements are in `benchmarks/sim_calibrate/measure.py`,
`benchmarks/sim_calibrate/send.py`, `sim_calibrate/contention.py` and
`sim_calibrate/receive.py`, the simulator's
inputs in `sim_calibrate/profiling.py`, the prediction fix by fix in `sim_calibrate/predict.py`;
how fast an execution pipeline serves vs a local instance (runtime and profile) in
`benchmarks/sim_calibrate/pipeline.py`.

Usage: python -m benchmarks.sim_calibrate.main [--cores 2] [--repeats 3] [--run-real]
           [--requests 64] [--reuse JSON..] [--bursts JSON..]
"""

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks.sim_calibrate.predict import FIXES, MODES, predict, simulate_burst
from benchmarks.sim_calibrate.profiling import diagnostics
from benchmarks.sim_calibrate.repeats import (
    SCENARIOS,
    BurstSettings,
    bursts_of,
    measured_summary,
    paired_errors,
    relative_errors,
    run_interleaved,
    scenario_name,
)
from benchmarks.sim_calibrate.rounds import (
    PIPELINE_MICRO_BATCHES,
    measure_round,
    profile_of,
    rounds_of,
)

__all__ = ["FIXES", "MODES", "predict", "simulate_burst"]  # their home: sim_calibrate/predict

RESULTS = Path(__file__).resolve().parents[1] / "results"
MEASURED = {
    1: RESULTS / "scaleout" / "scale_burst.json",
    2: RESULTS / "scaleout" / "scale_burst_k2.json",
}
TOLERANCE = 0.15


def committed_bursts() -> list[dict]:
    """The committed `scale_burst*.json` as one repeat (each report holds both modes)."""
    reports = {k: json.loads(p.read_text()) for k, p in MEASURED.items()}
    return [{scenario_name(k, m): reports[k] for k, m in SCENARIOS}]


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cores", type=float, default=2, help="cores the agents share")
    ap.add_argument("--model-mb", type=float, default=64, help="as scale_burst --model-mb")
    ap.add_argument("--reps", type=int, default=5, help="timings per measured point (median)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="profile rounds, and with --run-real runs of each runtime burst (interleaved)",
    )
    ap.add_argument("--run-real", action="store_true", help="run the runtime's bursts")
    ap.add_argument(
        "--requests", type=int, default=64, help="--run-real: requests per burst (scale_burst)"
    )
    ap.add_argument(
        "--reuse",
        type=Path,
        nargs="+",
        default=None,
        help="take the profile rounds from these calibrations instead of measuring them",
    )
    ap.add_argument(
        "--bursts",
        type=Path,
        nargs="+",
        default=None,
        help="take the runtime's bursts from these calibrations (their repeats, in turn)",
    )
    ap.add_argument("--json", type=Path, default=RESULTS / "sim_calibrate" / "sim_calibration.json")
    args = ap.parse_args()
    for name in ("repeats", "reps", "requests"):
        if getattr(args, name) < 1:
            fail(f"--{name} must be at least 1 (got {getattr(args, name)})")
    for name in ("cores", "model_mb"):
        if not getattr(args, name) > 0:
            fail(f"--{name.replace('_', '-')} must be positive (got {getattr(args, name)})")
    if args.run_real and args.bursts:
        fail("--run-real runs the bursts, --bursts reads them: give one of them")
    olds = []
    for path in [*(args.reuse or []), *(args.bursts or [])]:
        try:
            olds.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            fail(f"cannot read calibration {path}: {e}")
    args.olds = olds[: len(args.reuse or [])]
    args.old_bursts = []
    for path, old in zip(args.bursts or [], olds[len(args.reuse or []) :], strict=True):
        try:
            args.old_bursts += bursts_of(old, committed_bursts())
        except ValueError as e:
            fail(f"--bursts {path}: {e}")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    rounds: list[dict] = []
    for path, old in zip(args.reuse or [], args.olds, strict=True):
        try:
            rounds += rounds_of(old)
        except ValueError as e:
            fail(f"--reuse {path}: {e}")
    if rounds and not any("engine" in r for r in rounds):
        fail("--reuse: no full profile round (a contention-only JSON adds to another's rounds)")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_start = os.getloadavg()
    # The profile is measured on the committed burst's settings (K=1, 64 requests: the
    # send cost's idle burst must outlast its sending window), whatever `--requests` is.
    first = json.loads(MEASURED[1].read_text())
    if args.run_real:

        def one_round(r: int) -> dict:
            return measure_round(args.model_mb, first, args.reps, args.repeats, args.cores)

        settings = BurstSettings(model_mb=args.model_mb, requests=args.requests)
        bursts, fresh = run_interleaved(args.repeats, settings, None if rounds else one_round)
        rounds = rounds or fresh
    else:
        bursts = args.old_bursts or committed_bursts()
        if not rounds:
            rounds = [
                measure_round(args.model_mb, first, args.reps, args.repeats, args.cores)
                for _ in range(args.repeats)
            ]
    if args.run_real or not args.reuse:
        # What was measured is on disk before anything is predicted from it: a failure
        # below loses no measurement (`--reuse JSON --bursts JSON` predicts again).
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"profile_rounds": rounds, "bursts": bursts}) + "\n")
    reals = {
        k: {key: v for key, v in bursts[0][scenario_name(k, m)].items() if key != "modes"}
        for k, m in SCENARIOS
    }
    profile = profile_of(rounds, reals[1])
    if (
        abs(profile["engine"]["model_bytes"] - reals[1]["model_bytes"])
        > 1e-3 * reals[1]["model_bytes"]
    ):
        fail("the profile's model size differs from the bursts': give the same --model-mb")
    predicted = predict(profile, reals, args.cores)
    # Each repeat's own profile against its own bursts (fresh rounds beside the bursts only).
    paired = None
    if args.run_real and not args.reuse:
        paired = [predict(profile_of([r], reals[1]), reals, args.cores) for r in rounds]
    report: dict = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "started_utc": started,
        "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_average_start_end": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
        "repeats": len(bursts),
        "profile_rounds_count": len(rounds),
        "burst_requests": reals[1]["requests"],
        "burst_order": [list(b) for b in bursts],
        **profile,
        "shared_cores": args.cores,
        "pipeline_micro_batches": PIPELINE_MICRO_BATCHES,
        "tolerance": TOLERANCE,
        "scenarios": {},
    }
    for k, mode in SCENARIOS:
        name = scenario_name(k, mode)
        runs = [b[name]["modes"][mode] for b in bursts]
        row = {"measured": measured_summary(runs)} | predicted[name]
        row["relative_error"] = relative_errors(row["predicted"], row["measured"])
        row["within_tolerance"] = all(abs(e) <= TOLERANCE for e in row["relative_error"].values())
        if paired is not None:
            row["paired_by_repeat"] = paired_errors([p[name]["predicted"] for p in paired], runs)
        shaped = (profile.get("burst_shapes") or {}).get("per_layer_s")
        row["diagnostics"] = [
            diagnostics(profile["engine"], reals[k], m, shaped)
            for m in runs
            if "endpoints_opened" in m
        ]
        report["scenarios"][name] = row
        med = {q: v["median"] for q, v in row["measured"].items()}
        span = {q: (v["min"], v["max"]) for q, v in row["measured"].items()}
        print(f"{name}: runtime median {med} (min, max {span}) error {row['relative_error']}")
    rows = report["scenarios"].values()
    report["max_abs_relative_error"] = max(
        abs(e) for r in rows for e in r["relative_error"].values()
    )
    report["all_within_tolerance"] = all(r["within_tolerance"] for r in rows)
    report["runtime_max_spread_vs_median"] = max(
        max(abs(v["min_vs_median"]), abs(v["max_vs_median"]))
        for r in rows
        for v in r["measured"].values()
    )
    report["profile_rounds"] = rounds
    report["bursts"] = bursts
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    keys = ("repeats", "transfer_cores", "endpoint_open_s", "pipeline_open_s", "pipeline_speed")
    keys += ("send_cost_s_per_gb", "transfer_cores_serving", "serving_receive_slowdown")
    keys += ("serving_during_multicast", "wakeups_queue_check")
    keys += ("max_abs_relative_error", "all_within_tolerance")
    print(json.dumps({k: report[k] for k in (*keys, "runtime_max_spread_vs_median")}, indent=1))


if __name__ == "__main__":
    main()
