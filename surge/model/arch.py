"""The shape of a Llama-family model, read from a Hugging Face `config.json`.

`ModelArch` is the one description of a model that the store, the engine and (later) the
policies share. It is parsed and validated once, here; everything downstream trusts it.
Supported families: Llama 2/3 (GQA, rope scaling), Mistral, Qwen2 (qkv bias).
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from surge.errors import SurgeError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding settings."""

    theta: float = 10000.0
    """Base of the rotary frequencies."""
    rope_type: str = "default"
    """`default`, `linear` (positions divided by `factor`) or `llama3` (Llama 3.1 scaling)."""
    factor: float = 1.0
    """Scaling factor for `linear` and `llama3`."""
    low_freq_factor: float = 1.0
    """`llama3` only: wavelengths above original_max / low_freq_factor are fully scaled."""
    high_freq_factor: float = 4.0
    """`llama3` only: wavelengths below original_max / high_freq_factor are kept."""
    original_max_position_embeddings: int = 8192
    """`llama3` only: the context length the model was pre-trained with."""


@dataclass(frozen=True)
class ModelArch:
    """Everything the engine needs to know about a model's shape."""

    model_type: str
    """HF model type: llama, mistral or qwen2."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    """Longest sequence (prompt + generated) the model accepts."""
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    qkv_bias: bool = False
    """Whether q/k/v projections have a bias (Qwen2; Llama with attention_bias)."""
    o_bias: bool = False
    """Whether the output projection has a bias (Llama with attention_bias)."""
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"
    """Dtype of the checkpoint's weights (float32, float16 or bfloat16)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as stored in a manifest."""
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "ModelArch":
        """Inverse of `to_dict`."""
        d = dict(d)
        d["rope"] = RopeConfig(**d["rope"])
        d["eos_token_ids"] = tuple(d["eos_token_ids"])
        return ModelArch(**d)


def _rope_from_hf(cfg: dict[str, Any]) -> RopeConfig:
    # transformers 5 writes `rope_parameters` (with rope_theta inside); older configs write
    # `rope_theta` and `rope_scaling` at the top level. Accept both.
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise SurgeError(
            f"rope type {rope_type!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}); use a checkpoint with one of these"
        )
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", cfg.get("max_position_embeddings", 8192))
        ),
    )


def arch_from_hf_config(cfg: dict[str, Any]) -> ModelArch:
    """Parse a HF `config.json` dict, with a clear error for anything unsupported."""
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise SurgeError(
            f"model_type {model_type!r} is not a Llama-family model; surge supports "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} checkpoints"
        )
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise SurgeError(f"hidden_act {act!r} is not supported (only silu)")
    missing = [
        k
        for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
        if k not in cfg
    ]
    if missing:
        raise SurgeError(f"config.json lacks {', '.join(missing)}; is it a complete HF config?")
    num_heads = int(cfg.get("num_attention_heads", 0))
    if num_heads <= 0:
        raise SurgeError("config.json lacks num_attention_heads")
    num_kv_heads = int(cfg.get("num_key_value_heads") or num_heads)
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // num_heads)
    if num_heads % num_kv_heads:
        raise SurgeError(
            f"num_attention_heads={num_heads} is not a multiple of "
            f"num_key_value_heads={num_kv_heads}"
        )
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    attention_bias = bool(cfg.get("attention_bias", False))
    dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
    arch = ModelArch(
        model_type=model_type,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=_rope_from_hf(cfg),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        dtype=dtype,
    )
    if arch.num_layers < 1:
        raise SurgeError("config.json has num_hidden_layers < 1")
    return arch


def with_generation_eos(arch: ModelArch, hf_dir: Path) -> ModelArch:
    """`arch` stopping also at every id of `generation_config.json`'s `eos_token_id` (an
    instruct model's end-of-turn, e.g. Llama 3's <|eot_id|>, is often only there), as
    transformers and vLLM stop."""
    try:
        eos = json.loads((Path(hf_dir) / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return arch
    extra = eos if isinstance(eos, list) else [] if eos is None else [eos]
    ids = tuple(dict.fromkeys([*arch.eos_token_ids, *(int(i) for i in extra)]))
    return ModelArch.from_dict({**arch.to_dict(), "eos_token_ids": list(ids)})


def load_hf_config(hf_dir: Path) -> dict[str, Any]:
    """Read `config.json` of a HF checkpoint directory, with user-facing errors."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise SurgeError(f"{hf_dir} is not a directory; give the path of a HF checkpoint")
    path = hf_dir / "config.json"
    if not path.is_file():
        raise SurgeError(f"{hf_dir} has no config.json; is it a Hugging Face checkpoint?")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SurgeError(f"{path} is not valid JSON: {e}") from None


EMBED_NAME = "model.embed_tokens.weight"
FINAL_NORM_NAME = "model.norm.weight"
LM_HEAD_NAME = "lm_head.weight"


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def layer_tensor_names(arch: ModelArch, layer: int) -> list[str]:
    """HF names of every tensor of decoder layer `layer`, in the order they are packed
    (q/k/v weights back to back, then their biases; gate/up likewise)."""
    p = layer_prefix(layer)
    attn, mlp = f"{p}self_attn.", f"{p}mlp."
    names = [p + "input_layernorm.weight"]
    names += [f"{attn}{proj}.weight" for proj in ("q_proj", "k_proj", "v_proj")]
    if arch.qkv_bias:
        names += [f"{attn}{proj}.bias" for proj in ("q_proj", "k_proj", "v_proj")]
    names.append(f"{attn}o_proj.weight")
    if arch.o_bias:
        names.append(f"{attn}o_proj.bias")
    names.append(p + "post_attention_layernorm.weight")
    names += [f"{mlp}gate_proj.weight", f"{mlp}up_proj.weight"]
    if arch.mlp_bias:
        names += [f"{mlp}gate_proj.bias", f"{mlp}up_proj.bias"]
    names.append(f"{mlp}down_proj.weight")
    if arch.mlp_bias:
        names.append(f"{mlp}down_proj.bias")
    return names
