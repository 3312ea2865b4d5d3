"""Profile rounds of `benchmarks/sim_calibrate/main.py`: one round of every measurement, and the
simulator's inputs from one or several rounds (medians).

A round (`measure_round`): the serving step and agent round trip (`measure_engine`), the
transport (`measure_transport`), endpoint opening (`measure_endpoint_open`), the send cost
(`measure_send_cost`), pipeline vs local serving (`measure_pipeline_serving`), the
multicast while K hot instances serve (`measure_multicast_while_serving`), blocks into a
serving vs an idle agent (`measure_receive_while_serving`), the hot source's serving with
and without a multicast (`measure_serving_during_multicast`), the K=2 multicast with and
without pipelines serving on its receivers (`measure_queue`); a dict of
their raw reports. `profile_of(rounds)` turns rounds into what `simulate_burst` takes: the
field-wise medians (every round's raw numbers kept under `runs` / `rounds`) and the
pipeline speed derived from them. A previous calibration's JSON reads back as its rounds
(`rounds_of`), for `--reuse`.
"""

import logging
import math
import statistics
import time

from benchmarks.sim_calibrate.contention import measure_multicast_while_serving, median_contention
from benchmarks.sim_calibrate.measure import (
    measure_endpoint_open,
    measure_engine,
    measure_transport,
)
from benchmarks.sim_calibrate.pipeline import measure_pipeline_serving, profile_pipeline_vs_local
from benchmarks.sim_calibrate.profiling import burst_shape_costs
from benchmarks.sim_calibrate.receive import measure_receive_while_serving, median_receive
from benchmarks.sim_calibrate.send import measure_send_cost
from benchmarks.sim_calibrate.serving import measure_serving_during_multicast, median_serving
from benchmarks.sim_calibrate.wakeup_queue import measure_queue, median_queue
from surge.policy.multicast.timing import BITS_PER_BYTE

log = logging.getLogger("sim_calibrate")

PIPELINE_MICRO_BATCHES = 2
"""As the runtime's `PipelineEndpoint` (capacity = micro-batch groups x batch limit)."""
SEND_ROUNDS = 5
"""Rounds of the send cost over the whole calibration (median): one round's idle vs sending
pair spread 6.6-14.6 s/GB at load 2-3."""
QUEUE_PAIRS = 1
"""(served, hot_only) multicasts of fix 15's check per round (~30 s each round)."""
TRANSPORT_REPS = 1
"""Multicasts per transport configuration per round (medians over the rounds)."""


def measure_round(
    model_mb: float, real: dict, reps: int, num_rounds: int, cores: float = 2.0
) -> dict:
    """One round of every profile measurement on the burst's model (`real`: a scale_burst
    report's settings; `cores`: the cores the agents share)."""
    blocks, out = real["blocks"], {}
    steps = (
        ("engine", lambda: measure_engine(model_mb, blocks, reps, real)),
        ("transport", lambda: measure_transport(model_mb, blocks, real, TRANSPORT_REPS)),
        ("endpoint_open", lambda: measure_endpoint_open(model_mb, blocks, real, 1)),
        (
            "send_cost",
            lambda: measure_send_cost(model_mb, blocks, real, math.ceil(SEND_ROUNDS / num_rounds)),
        ),
        ("pipeline_serving", lambda: measure_pipeline_serving(model_mb, blocks, real)),
        (
            "contention",
            lambda: measure_multicast_while_serving(
                model_mb, blocks, real, out["send_cost"]["send_cpu_s_per_gb"]
            ),
        ),
        ("receive", lambda: measure_receive_while_serving(model_mb, blocks, real)),
        ("serving", lambda: measure_serving_during_multicast(model_mb, blocks, real, cores)),
        (
            "queue",
            lambda: measure_queue(
                model_mb,
                blocks,
                real,
                cores,
                queue_transfer_cores(out),
                QUEUE_PAIRS,
            ),
        ),
    )
    for name, measure in steps:
        t = time.monotonic()
        try:
            out[name] = measure()
        except Exception as e:
            if name != "queue":
                raise
            # fix 15's check, not an input: its failure must not end the calibration
            log.warning("  profile: queue failed: %s", e)
            out[name] = {"error": repr(e)}
        log.info("  profile: %s measured (%.0f s)", name, time.monotonic() - t)
    return out


def queue_transfer_cores(out: dict) -> float:
    """Fix 15's check's transfer CPU: this round's K=2 contention measurement (per K, keys
    "1", "2"), else its standalone transport's."""
    per_k = out.get("contention", {}).get("transfer_cores_serving") or {}
    return per_k.get("2") or out["transport"]["transfer_cores"]


def median_of(runs: list[dict]) -> dict:
    """Field-wise median of repeated measurements (numbers, dicts of numbers; dicts of
    lists are joined; other fields from the first run), over every run given (or the
    `runs` inside a previous median)."""
    flat = [x for r in runs for x in (r.get("runs") or [r])]
    out: dict = {}
    for key, value in flat[0].items():
        if isinstance(value, dict) and all(isinstance(v, float | int) for v in value.values()):
            out[key] = {k: statistics.median(r[key][k] for r in flat) for k in value}
        elif isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
            out[key] = {k: [x for r in flat for x in r[key][k]] for k in value}
        elif isinstance(value, float | int) and key not in ("num_layers", "model_bytes"):
            out[key] = statistics.median(r[key] for r in flat)
        else:
            out[key] = value
    out["runs"] = flat
    return out


def send_cpu_cores(send: dict, transport: dict) -> float:
    """The sender's cores per transfer at the cap (at most `transfer_cores`)."""
    gb_per_s = transport.get("one_link_gbps", 0.0) / BITS_PER_BYTE
    cores = send.get("send_cpu_s_per_gb", 0.0) * gb_per_s
    return round(min(cores, transport["transfer_cores"]), 4)


def profile_of(rounds: list[dict], real: dict) -> dict:
    """The simulator's inputs from `rounds` (one: that round's numbers; several: medians of
    every run inside them). Rounds holding only a `contention` measurement (a separate
    `sim_calibrate/contention` run given to `--reuse`) count for it alone."""
    contention = median_contention(rounds)
    receive = median_receive(rounds)
    serving = median_serving(rounds)
    rounds_all = rounds
    rounds = [r for r in rounds if "engine" in r]
    engine = median_of([r["engine"] for r in rounds])
    transport = median_of([r["transport"] for r in rounds])
    opens = median_of([r["endpoint_open"] for r in rounds])
    send = median_of([x for r in rounds for x in r["send_cost"]["rounds"]])
    pipes = [r["pipeline_serving"] for r in rounds]
    pipe = dict(pipes[0]) | {
        "pipeline_throughput_vs_local": statistics.median(
            p["pipeline_throughput_vs_local"] for p in pipes
        ),
        "runs": pipes,
    }
    pipe["profile_pipeline_throughput_vs_local"] = profile_pipeline_vs_local(
        engine, pipe["stages"], PIPELINE_MICRO_BATCHES, real["max_num_seqs"]
    )
    # The runtime's pipeline vs local throughput over the model's: the pipeline's speed.
    speed = pipe["pipeline_throughput_vs_local"] / pipe["profile_pipeline_throughput_vs_local"]
    # Fix 13: the costs fitted at the burst's shapes (median over every engine run), and the
    # pipeline speed against that model.
    fits = [burst_shape_costs(run, real) for run in engine["runs"]]
    shaped = engine | {"per_layer_s": {k: statistics.median(f[k] for f in fits) for k in fits[0]}}
    shaped_ratio = profile_pipeline_vs_local(
        shaped, pipe["stages"], PIPELINE_MICRO_BATCHES, real["max_num_seqs"]
    )
    return {
        "engine": engine,
        "transport": transport,
        "endpoint_open": opens,
        "send_cost": send,
        "pipeline_serving": pipe,
        "transfer_cores": transport["transfer_cores"],
        "endpoint_open_s": opens["endpoint_open_s"],
        "pipeline_open_s": opens["pipeline_open_s"],
        "pipeline_speed": round(speed, 4),
        "burst_shapes": {
            "per_layer_s": shaped["per_layer_s"],
            "profile_pipeline_throughput_vs_local": shaped_ratio,
            "pipeline_speed": round(pipe["pipeline_throughput_vs_local"] / shaped_ratio, 4),
        },
        # Serving lost per GB sent cannot be negative: a negative median (serving measured
        # faster while sending) is noise around no loss, so the simulator gets 0.
        "send_cost_s_per_gb": max(0.0, send["send_cost_s_per_gb"]),
        # The sender's part of a transfer's CPU (the rest is the receiver's): CPU seconds
        # per GB sent x GB/s at the cap, as `transfer_cores` is per block at the cap (0
        # where a round did not measure it).
        "send_cpu_cores": send_cpu_cores(send, transport),
        # Fix 10: the cores a block transfer in flight takes while K hot instances serve
        # (median over the rounds and both K; None where no round measured it).
        "contention": contention,
        "transfer_cores_serving": contention.get("transfer_cores_all_k"),
        # Fix 11: how many times longer blocks take into a serving agent than into an idle
        # one (median over every pair; at least 1: a ratio under 1 is noise around no
        # slow-down; None where no round measured it).
        "serving_receive_slowdown": None if receive is None else max(1.0, receive),
        "serving_receive_slowdown_measured": receive,
        # Fix 12's check: the hot source during a multicast over alone (its tokens/s and
        # cores), and its cores by fix 12's model from the others' measured CPU (medians
        # over every pair; None where no round measured it).
        "serving_during_multicast": serving,
        # Fix 14: the hot agent's tokens per engine CPU-second with a multicast over alone
        # (median over every pair; at most 1: above is noise around no loss; None where no
        # round measured it).
        "serving_efficiency_in_transfers": None
        if serving is None
        else min(1.0, serving["step_efficiency"]),
        # Fix 15's check: the K=2 multicast while pipelines serve on its receivers over
        # while only the hot sources serve, and the receivers' event loops' share of a
        # core, measured beside fix 15's model (medians over every pair; None where no
        # round measured it).
        "wakeups_queue_check": median_queue(rounds_all),
    }


def rounds_of(old: dict) -> list[dict]:
    """A previous calibration's profile rounds (older JSONs: their medians as one round)."""
    if "profile_rounds" in old:
        return old["profile_rounds"]
    needed = ("engine", "transport", "endpoint_open", "send_cost", "pipeline_serving")
    missing = [k for k in needed if k not in old]
    if missing:
        raise ValueError(f"it has no {', '.join(missing)}")
    send = old["send_cost"]
    if "rounds" not in send:
        send = send | {"rounds": [{k: v for k, v in send.items() if k != "runs"}]}
    return [{k: old[k] for k in needed} | {"send_cost": send}]
