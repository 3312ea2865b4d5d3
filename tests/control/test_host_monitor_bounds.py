"""BlitzScale's §5.3 monitor bounds on a CPU host (`surge serve` without GPU-time emulation):
the host estimate's decode step grows with its batch by one token's compute per sequence
(`control/emulation.instance_costs`), so the decode bound is the tokens/s of the largest
batch whose step meets the TBT SLO, not every sequence the engine takes."""

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
