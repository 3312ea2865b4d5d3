"""Rotary frequencies equal transformers' for every rope type surge accepts."""

import pytest
import torch

from surge.engine.model import rope_inv_freq
from surge.errors import SurgeError
from surge.model.arch import arch_from_hf_config

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


@pytest.mark.parametrize("kind", list(ROPES))
def test_inv_freq_matches_transformers(kind: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=300,
        hidden_size=256,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=131072,
        rope_parameters=ROPES[kind],
    )
    ref = LlamaForCausalLM(cfg).model.rotary_emb.inv_freq
    arch = arch_from_hf_config(cfg.to_dict())
    assert arch.rope.rope_type == kind
    torch.testing.assert_close(rope_inv_freq(arch.rope, arch.head_dim), ref, rtol=1e-6, atol=0)


def test_old_style_rope_scaling_and_unknown_types() -> None:
    base = {
        "model_type": "llama",
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
    }
    arch = arch_from_hf_config(
        {**base, "rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 2.0}}
    )
    assert (arch.rope.theta, arch.rope.rope_type, arch.rope.factor) == (1e6, "linear", 2.0)
    with pytest.raises(SurgeError, match="rope type 'yarn' is not supported"):
        arch_from_hf_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
