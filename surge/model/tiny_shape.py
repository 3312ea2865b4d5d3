"""The shape of a tiny random model: its settings (`TinyModelConfig`), the presets, and the
checks of a shape made before any weight is (torch is not imported here, so
`surge model create-tiny` refuses a bad shape at once).

What flows: the command's shape flags in; a checked `TinyModelConfig` out, which
`surge.model.tiny.create_tiny_model` turns into a checkpoint. Owned by model/.
"""

from dataclasses import dataclass, replace
from pathlib import Path

from surge.errors import SurgeError
from surge.model.tokenizer import check_vocab_size


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of a tiny random model."""

    num_layers: int = 4
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    """Fewer kv heads than heads: grouped-query attention, as in Llama 3."""
    intermediate_size: int = 344
    vocab_size: int = 1024
    max_position_embeddings: int = 2048
    seed: int = 0
    dtype: str = "float32"
    """float32 or bfloat16."""
    model_type: str = "llama"
    """llama or qwen2 (qwen2 adds q/k/v biases)."""
    tie_word_embeddings: bool = False


PRESETS: dict[str, TinyModelConfig] = {
    "tiny": TinyModelConfig(),  # ~4 MB in float32
    "100mb": TinyModelConfig(
        num_layers=6,
        hidden_size=512,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=1536,
        vocab_size=8192,
    ),  # ~27M parameters, ~109 MB
    "500mb": TinyModelConfig(
        num_layers=8,
        hidden_size=1024,
        num_heads=16,
        num_kv_heads=8,
        intermediate_size=2816,
        vocab_size=16384,
    ),  # ~127M parameters, ~508 MB
}


def check_shape(cfg: TinyModelConfig) -> None:
    """Raise `SurgeError` (naming the flags to fix) unless `cfg` is a shape a Llama or Qwen2
    checkpoint can have."""
    sizes = (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
             cfg.num_kv_heads)  # fmt: skip
    if min(sizes) < 1:  # before the divisions below (--heads 0 was a ZeroDivisionError)
        raise SurgeError("--layers, --hidden, --intermediate, --heads and --kv-heads must be >= 1")
    if cfg.hidden_size % cfg.num_heads:
        raise SurgeError(
            f"--hidden {cfg.hidden_size} must be a multiple of --heads {cfg.num_heads}"
        )
    if cfg.num_heads % cfg.num_kv_heads:
        raise SurgeError(
            f"--heads {cfg.num_heads} must be a multiple of --kv-heads {cfg.num_kv_heads}"
        )
    if cfg.model_type not in ("llama", "qwen2"):
        raise SurgeError(f"--arch {cfg.model_type!r} is not one of llama, qwen2")
    check_vocab_size(cfg.vocab_size)


def preset(name: str, **overrides: object) -> TinyModelConfig:
    """A preset config with some fields replaced (None values are ignored)."""
    if name not in PRESETS:
        raise SurgeError(f"--preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


def parameter_count(cfg: TinyModelConfig) -> int:
    """Parameters of a checkpoint made from `cfg` (embeddings and lm_head counted apart)."""
    h, kv = cfg.hidden_size, cfg.hidden_size // cfg.num_heads * cfg.num_kv_heads
    attention = h * (h + 2 * kv) + h * h
    mlp = 3 * h * cfg.intermediate_size
    return 2 * cfg.vocab_size * h + cfg.num_layers * (attention + mlp + 2 * h) + h


def check_fits_in_memory(cfg: TinyModelConfig) -> None:
    """Refuse (`SurgeError` with the numbers) a model whose float32 weights, made in memory
    before they are written, exceed what this machine has available (issue 36:
    `--hidden 100000 --layers 100` died with an allocator traceback)."""
    need = parameter_count(cfg) * 4
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        return
    fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
    available = int(fields.get("MemAvailable", "0 kB").split()[0]) * 1024
    if available and need > available:
        raise SurgeError(
            f"this shape has {parameter_count(cfg):,} parameters: {need / 1e9:.1f} GB of "
            f"float32 weights in memory, but this machine has {available / 1e9:.1f} GB "
            f"available; choose a smaller --hidden, --layers, --intermediate or --vocab"
        )
