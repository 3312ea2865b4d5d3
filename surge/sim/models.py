"""Model profiles: shapes from `profiles/models.json`, bytes per layer, KV bytes per token.

In: a model name. Out: a `ModelProfile` whose byte counts follow from its shape:
attention 2*h*h + 2*h*kv_dim (q, o, k, v), MLP 3*h*i (gated) or 2*h*i (plain), two
norms, embeddings (and an untied head) with the first and last layer.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from surge.errors import SurgeError
from surge.sim.hardware import load_json


@dataclass(frozen=True)
class ModelProfile:
    """A transformer's shape and the sizes the simulator needs."""

    name: str
    """Model name, e.g. llama2-7b."""
    num_layers: int
    """Decoder layers."""
    hidden_size: int
    """Model width."""
    intermediate_size: int
    """MLP width."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """KV heads (GQA when fewer than query heads)."""
    vocab_size: int
    """Vocabulary size."""
    context_tokens: int
    """Longest prompt + output the model accepts."""
    gated_mlp: bool
    """Three MLP matrices (Llama) rather than two (OPT)."""
    dtype_bytes: int
    """Bytes per parameter (2 for fp16/bf16)."""

    def __post_init__(self) -> None:
        sizes = (self.num_layers, self.hidden_size, self.intermediate_size, self.vocab_size)
        if min(*sizes, self.num_key_value_heads) < 1:  # KV heads 0: a ZeroDivisionError below
            raise SurgeError(f"model {self.name}: sizes must be >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise SurgeError(f"model {self.name}: heads must be a multiple of KV heads")

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V) per token."""
        return self.hidden_size // self.num_attention_heads * self.num_key_value_heads

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer."""
        h = self.hidden_size
        attention = 2 * h * h + 2 * h * self.kv_dim
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size
        return attention + mlp + 2 * h

    @property
    def layer_bytes(self) -> int:
        """Bytes of one decoder layer."""
        return self.layer_params * self.dtype_bytes

    @property
    def embedding_bytes(self) -> int:
        """Embeddings plus the (untied) output head."""
        return 2 * self.vocab_size * self.hidden_size * self.dtype_bytes

    @property
    def total_bytes(self) -> int:
        """All weights."""
        return self.num_layers * self.layer_bytes + self.embedding_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache of one token over all layers."""
        return 2 * self.kv_dim * self.dtype_bytes * self.num_layers

    @property
    def flops_per_token_per_layer(self) -> float:
        """Forward FLOPs of one token through one layer (2 per parameter)."""
        return 2.0 * self.layer_params


def model_names() -> tuple[str, ...]:
    """Names of the bundled model profiles."""
    return tuple(k for k in load_json("models.json") if not k.startswith("_"))


def load_model(name: str) -> ModelProfile:
    """The bundled model profile `name`, or a JSON file shaped like one entry of
    models.json (its `name` field, else the file name, names it)."""
    table = load_json("models.json")
    if name in table and not name.startswith("_"):
        d = table[name]
    elif name.endswith(".json") and Path(name).is_file():
        d = _model_file(Path(name))
        name = str(d.get("name", Path(name).stem))
    else:
        raise SurgeError(f"unknown model {name!r}; choose one of {', '.join(model_names())}")
    try:
        numbers = [int(d[k]) for k in SHAPE_KEYS] + [int(d.get("dtype_bytes", 2))]
    except (KeyError, TypeError, ValueError):  # a model file's missing or non-number field
        raise SurgeError(
            f"model {name}: a model file needs the integers {', '.join(SHAPE_KEYS)} (as an "
            "entry of the bundled models.json)"
        ) from None
    *shape, dtype_bytes = numbers
    return ModelProfile(name, *shape, d.get("mlp", "gated") == "gated", dtype_bytes)


SHAPE_KEYS = (
    "num_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "context_tokens",
)
"""A model profile's shape, in `ModelProfile`'s order."""


def _model_file(path: Path) -> dict:
    """A `--model FILE.json`'s object, or one `SurgeError` (a traceback before)."""
    try:
        d = json.loads(path.read_text())
    except (ValueError, RecursionError) as e:
        raise SurgeError(f"model file {path} is not valid JSON ({str(e)[:200]})") from None
    if not isinstance(d, dict):
        raise SurgeError(f"model file {path} must hold one JSON object (a models.json entry)")
    return d
