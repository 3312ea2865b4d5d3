"""Tiny Llama checkpoints with random weights, for tests, demos and benchmarks.

`create_tiny_model` writes a real Hugging Face checkpoint (`config.json`,
`model.safetensors`, `generation_config.json`, `tokenizer.json`) from a seed; the same
settings and seed give the same bytes. Nothing is downloaded.
"""

import json
import math
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from surge.model.arch import (
    EMBED_NAME,
    FINAL_NORM_NAME,
    LM_HEAD_NAME,
    arch_from_hf_config,
    layer_tensor_names,
)
from surge.model.blocks import torch_dtype
from surge.model.tiny_shape import PRESETS, TinyModelConfig, check_shape
from surge.model.tokenizer import BOS_ID, EOS_ID, build_tokenizer

SIMPLE_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ '\\n' }}"
    "{% if m.tool_call_id %}[result {{ m.tool_call_id }}] {% endif %}{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}"
    "[call {{ c.id }}: {{ c.function.name }}({{ c.function.arguments }})]{% endfor %}{{ '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{{ '\\n' }}{% endif %}"
)
"""The tiny models' chat template: one block per message, an open assistant block at the end
(the markers are plain text to the tokenizer):

    <|system|>
    You are terse.
    <|user|>
    Hello!
    <|assistant|>
"""


def hf_config_dict(cfg: TinyModelConfig) -> dict:
    """The `config.json` contents for a tiny model, in transformers 5 layout."""
    check_shape(cfg)
    torch_dtype(cfg.dtype)
    arch_name = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[cfg.model_type]
    return {
        "architectures": [arch_name],
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.hidden_size // cfg.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "dtype": cfg.dtype,
        "surge_tiny": asdict(cfg),
    }


def _random_weights(cfg: TinyModelConfig, hf_cfg: dict) -> dict[str, torch.Tensor]:
    # Scaled init (std 1/sqrt(fan_in)) keeps activations O(1) through the layers, so logits
    # are well separated and greedy decoding has few near-ties.
    arch = arch_from_hf_config(hf_cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    dtype = torch_dtype(cfg.dtype)

    def randn(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(dtype)

    q_out = arch.num_heads * arch.head_dim
    kv_out = arch.num_kv_heads * arch.head_dim
    h, inter = arch.hidden_size, arch.intermediate_size
    shapes = {
        "q_proj": (q_out, h),
        "k_proj": (kv_out, h),
        "v_proj": (kv_out, h),
        "o_proj": (h, q_out),
        "gate_proj": (inter, h),
        "up_proj": (inter, h),
        "down_proj": (h, inter),
    }
    out: dict[str, torch.Tensor] = {EMBED_NAME: randn(arch.vocab_size, h, std=1.0)}
    for layer in range(arch.num_layers):
        for name in layer_tensor_names(arch, layer):
            kind = name.split(".")[-2]
            if name.endswith("layernorm.weight"):
                out[name] = (1.0 + 0.1 * torch.randn(h, generator=gen)).to(dtype)
            elif name.endswith(".bias"):
                out[name] = randn(shapes[kind][0], std=0.1)
            else:
                rows, cols = shapes[kind]
                out[name] = randn(rows, cols, std=1.0 / math.sqrt(cols))
    out[FINAL_NORM_NAME] = (1.0 + 0.1 * torch.randn(h, generator=gen)).to(dtype)
    if not cfg.tie_word_embeddings:
        out[LM_HEAD_NAME] = randn(arch.vocab_size, h, std=1.0 / math.sqrt(h))
    return out


def create_tiny_model(out_dir: Path, cfg: TinyModelConfig = PRESETS["tiny"]) -> Path:
    """Write a HF-format checkpoint with random weights to `out_dir`; returns `out_dir`."""
    out_dir = Path(out_dir)
    hf_cfg = hf_config_dict(cfg)
    tokenizer = build_tokenizer(cfg.vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = _random_weights(cfg, hf_cfg)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    gen_cfg = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "do_sample": False}
    (out_dir / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    tokenizer.save(str(out_dir / "tokenizer.json"))
    # Shipped as transformers writes templates since 4.50, so tiny models chat as real ones.
    (out_dir / "chat_template.jinja").write_text(SIMPLE_CHAT_TEMPLATE)
    return out_dir
