"""BlitzScale's §5.3 monitor bounds on a CPU host (`surge serve` without GPU-time emulation):
the host estimate's decode step grows with its batch by one token's compute per sequence
(`control/emulation.instance_costs`), so the decode bound is the tokens/s of the largest
batch whose step meets the TBT SLO, not every sequence the engine takes. Checked against
this CPU's measurement of the default model (`benchmarks.engine.monitor_host_bound`)."""

import json
from pathlib import Path

import pytest

from surge.config import EngineConfig
from surge.control.emulation import instance_costs
from surge.policy.blitzscale.monitor import bounds
from surge.policy.slo import Slo
from surge.runtime.scaleout.estimates import HOST_ESTIMATES

SMOLLM2_BYTES = 651_306_240
"""The default model's store (SmolLM2-135M-Instruct, fp32; docs/models.md)."""
ENGINE = EngineConfig()


def test_a_host_decode_step_costs_one_tokens_compute_per_sequence() -> None:
    costs = instance_costs(None, HOST_ESTIMATES, SMOLLM2_BYTES, ENGINE)
    assert costs.decode_s(1) == pytest.approx(HOST_ESTIMATES.decode_s(SMOLLM2_BYTES))
    per_token_s = costs.prefill_s(1)
    assert costs.decode_s(8) - costs.decode_s(1) == pytest.approx(7 * per_token_s)
    assert costs.decode_s(64) > 8 * costs.decode_s(1)


def test_the_host_decode_bound_is_the_largest_batch_within_the_tbt_slo() -> None:
    costs = instance_costs(None, HOST_ESTIMATES, SMOLLM2_BYTES, ENGINE)
    slo = Slo()  # surge serve's default: 5 s TTFT, 200 ms TBT
    b = bounds(costs, slo)
    # a batch-free step (the estimate before) put it at all 64 sequences, ~983 tokens/s
    assert b.decode_batch < ENGINE.max_num_seqs
    assert costs.decode_s(b.decode_batch) <= slo.tpot_s < costs.decode_s(b.decode_batch + 1)
    assert b.decode_tokens_per_s == pytest.approx(b.decode_batch / costs.decode_s(b.decode_batch))
    assert b.decode_tokens_per_s < 150


MEASURED = Path(__file__).parents[2] / "benchmarks/results/engine/monitor_host_bound.json"


def test_this_cpus_measurement_bears_out_the_estimates_form_and_its_bounds_are_below_it() -> None:
    """`benchmarks.engine.monitor_host_bound` on this repository's VM (SmolLM2-135M, one
    thread, CPU-seconds): each sequence a decode step adds costs what a prompt token adds to
    a prefill (the estimate's form), and the bounds profiled from the estimate are below the
    measured ones (it scales out early), where a batch-free step's decode bound was above."""
    m = json.loads(MEASURED.read_text())
    assert m["store_bytes"] == SMOLLM2_BYTES
    prefill, decode = m["measured"]["prefill_s"], m["measured"]["decode_step_s"]
    per_token_s = (prefill["512"] - prefill["128"]) / (512 - 128)
    per_seq_s = (decode["64"] - decode["1"]) / (64 - 1)
    assert per_seq_s == pytest.approx(per_token_s, rel=0.25)
    est, meas = m["bounds"]["host_estimate"], m["bounds"]["measured"]
    costs = instance_costs(None, HOST_ESTIMATES, SMOLLM2_BYTES, ENGINE)
    b = bounds(costs, Slo())
    assert est["decode_tokens_per_s"] == pytest.approx(b.decode_tokens_per_s, rel=1e-3)
    assert est["prefill_tokens_per_s"] == pytest.approx(b.prefill_tokens_per_s, rel=1e-3)
    assert b.prefill_tokens_per_s < meas["prefill_tokens_per_s"]
    assert b.decode_tokens_per_s < meas["decode_tokens_per_s"]
    batch_free_s = costs.decode_s(1)  # the estimate before: every batch a one-sequence step
    assert ENGINE.max_num_seqs / batch_free_s > meas["decode_tokens_per_s"]
