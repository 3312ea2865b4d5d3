"""The burst as simulator inputs (`benchmarks/sim_calibrate/main.py`): the calibrated cluster
and model files from the measured serving step, and the burst's trace.

In: `measure_engine`'s dict (per-layer costs, the model's shape), the node count and link
rate. Out: JSON files `surge.sim` reads (an inline GPU profile with
`measured_layer_costs_s`) and a `Trace` of the burst (scale_burst's prompts, all at t=0).
`burst_shape_costs`: the per-layer costs fitted at the burst's shapes only (fix 13).
`diagnostics`: the hot sources' serving speed and the transport as one measured burst shows
them against what the profile says.
"""

import json
import statistics
from pathlib import Path

import numpy as np

from benchmarks.sim_calibrate.measure import fit


def sim_files(engine: dict, nodes: int, link_gbps: float, where: Path) -> tuple[str, str]:
    """Write the calibrated cluster and model files; return their paths."""
    arch = engine["arch"]
    model = {
        "name": "scale-burst-64mb",
        "num_layers": engine["num_layers"],
        "hidden_size": arch["hidden_size"],
        "intermediate_size": arch["intermediate_size"],
        "num_attention_heads": arch["num_heads"],
        "num_key_value_heads": arch["num_kv_heads"],
        "vocab_size": arch["vocab_size"],
        "context_tokens": 2048,
        "mlp": "gated",
        "dtype_bytes": 4,
    }
    c = engine["per_layer_s"]
    gpu = {
        "name": "cpu-1-thread (measured)",
        "memory_gib": 8,
        "tflops": 0.05,
        "mem_bandwidth_gbs": 10,
        "prefill_efficiency": 1.0,
        "decode_efficiency": 1.0,
        "layer_overhead_s": c["prefill_fixed"],
        "measured_layer_costs_s": [
            c["prefill_fixed"],
            c["prefill_per_token"],
            c["decode_fixed"],
            c["decode_per_seq"],
        ],
    }
    cluster = {
        "source": "scale_burst local cluster (agents on one machine, capped links)",
        "groups": [
            {
                "num_nodes": nodes,
                "gpu": gpu,
                "gpus_per_node": 1,
                "nic_gbps": link_gbps,
                "gpu_nic_gbps": None,
                "intra_gpu_gbps": 100,
                "nvlink": False,
                "pcie_gbps": 100,
                "ssd_gbps": 10,
                "registry_gbps": None,
                "host_memory_gib": 16,
                "disk_gb": 100,
            }
        ],
    }
    (where / "model.json").write_text(json.dumps(model))
    (where / "cluster.json").write_text(json.dumps(cluster))
    return str(where / "cluster.json"), str(where / "model.json")


def burst_shape_costs(engine: dict, real: dict) -> dict[str, float]:
    """`per_layer_s` fitted only at the shapes the burst runs (calibration fix 13): decode
    at batches up to the batch limit (`max_num_seqs`), prefill up to the batch limit x the
    longest prompt; the round trip per step as in `measure_engine`. The decode cost is
    concave in the batch (batch 8 costs ~1.2x batch 4), so the line through batches 1-8
    under-estimates batch 4, which the burst runs nearly always, by ~11%. `engine`: one
    `measure_engine` run (its points; without two distinct shapes of each kind there, its
    own `per_layer_s`)."""
    layers, batch = engine["num_layers"], real["max_num_seqs"]
    longest = batch * real["prompt_len"][1]
    pre = [(t, s) for t, s in engine.get("prefill_points_s", []) if t <= longest]
    dec = [(b, s) for b, s in engine.get("decode_points_s", []) if b <= batch]
    if len({t for t, _ in pre}) < 2 or len({b for b, _ in dec}) < 2:
        return dict(engine["per_layer_s"])
    a_p, b_p = fit([t for t, _ in pre], [s / layers for _, s in pre])
    a_d, b_d = fit([b for b, _ in dec], [s / layers for _, s in dec])
    hop = engine["agent_round_trip_per_step_s"] / layers
    return {
        "prefill_fixed": a_p + hop,
        "prefill_per_token": b_p,
        "decode_fixed": a_d + hop,
        "decode_per_seq": b_d,
    }


def burst_trace(requests: int, prompt_len: tuple[int, int], max_tokens: int):
    """The burst of scale_burst: same prompt lengths (same RNG draws), all at t=0."""
    import random

    from surge.traces.request import Trace

    rng = random.Random(0)
    lens = []
    lo, hi = prompt_len
    for _ in range(requests):
        n = rng.randint(lo, hi)
        for _ in range(n):
            rng.randrange(2, 500)
        lens.append(n)
    return Trace(
        "scale-burst",
        np.zeros(requests),
        np.asarray(lens, dtype=np.int64),
        np.full(requests, max_tokens, dtype=np.int64),
    )


def diagnostics(engine: dict, real: dict, meas: dict, shaped: dict | None = None) -> dict:
    """What the error comes from: serving speed of the hot sources and transport time,
    measured in the real run vs what the calibrated profile says (`shaped`: fix 13's
    `per_layer_s`, whose rate is added)."""
    n = engine["num_layers"]
    batch, out = real["max_num_seqs"], real["max_tokens"]
    tokens = batch * sum(real["prompt_len"]) / 2

    def rate(c: dict) -> float:
        batch_s = n * (c["prefill_fixed"] + c["prefill_per_token"] * tokens)
        batch_s += (out - 1) * n * (c["decode_fixed"] + c["decode_per_seq"] * batch)
        return round(real["sources"] * batch * out / batch_s, 1)

    first_open = min(t for _, t, _ in meas["endpoints_opened"])
    before = [v for t, v in meas["tokens_per_s_timeline"] if t + 0.25 <= first_open]
    copy_s = real["model_bytes"] * 8 / (real["link_gbps"] * 1e9)
    extra = {"sources_tokens_per_s_burst_fit": rate(shaped)} if shaped else {}
    return {
        "sources_tokens_per_s_measured": round(statistics.mean(before), 1) if before else None,
        "sources_tokens_per_s_profile": rate(engine["per_layer_s"]),
        **extra,
        "multicast_complete_s_measured": round(meas["multicast_complete_s"], 3),
        "one_full_copy_at_cap_s": round(copy_s, 3),
        "first_endpoint_opened_s_measured": first_open,
        "endpoints_opened_s_measured": [t for _, t, _ in meas["endpoints_opened"]],
    }
