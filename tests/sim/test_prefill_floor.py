"""A prefill step streams every layer's weights once, however few its tokens (the roofline's
memory bound): a short prompt's prefill costs at least a one-sequence decode step's weight
read; a long prompt's is compute-bound as before. The emulation paces with the same model."""

import pytest

from surge.sim.costs import cost_model
from surge.sim.hardware import gpu_profile
from surge.sim.models import load_model


def test_a_short_prefill_costs_at_least_the_weights_read() -> None:
    cost = cost_model(load_model("llama2-13b"), gpu_profile("H800"))
    weights_s = cost.num_layers * (cost.decode_fixed_s - cost.prefill_fixed_s)
    assert weights_s > 0.005  # ~26 GB at the H800's memory bandwidth
    for tokens in (1, 4, 12):
        assert cost.prefill_s(tokens) >= weights_s
        assert cost.prefill_s(tokens) == pytest.approx(cost.prefill_s(1))  # flat below the knee
    # Long prompts are compute-bound: linear in the tokens, above the floor.
    assert cost.prefill_s(4096) == pytest.approx(
        cost.num_layers * (cost.prefill_fixed_s + 4096 * cost.prefill_per_token_s)
    )
    assert cost.prefill_s(4096) > 10 * weights_s


def test_a_live_scaled_batch_pays_the_floor_once_per_layer_run() -> None:
    cost = cost_model(load_model("llama2-7b"), gpu_profile("A100"))
    n = cost.num_layers
    assert cost.prefill_parts_s([(4, n), (4, n // 2)]) == pytest.approx(cost.prefill_s(4))
    assert cost.prefill_parts_s([(4096, n)]) == pytest.approx(cost.prefill_s(4096))
