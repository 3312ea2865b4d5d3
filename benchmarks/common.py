"""Pieces the runtime benchmarks share: model shapes of a chosen size, and seeding an
agent's disk tier with a store without copying it."""

from pathlib import Path

from surge.model.manifest import Manifest
from surge.model.tiny import TinyModelConfig
from surge.runtime.launcher import LocalCluster


def model_config(model_mb: float, num_layers: int) -> TinyModelConfig:
    """A Llama shape of about `model_mb` MB in float32 with `num_layers` layers."""
    hidden, vocab = 256, 512  # a small vocabulary keeps the first and last blocks close in size
    fixed = 2 * vocab * hidden + hidden
    per_layer_target = (model_mb * 1e6 / 4 - fixed) / num_layers
    attn = 3 * hidden * hidden  # q (256x256), k and v (128x256 each), o (256x256)
    inter = max(64, int((per_layer_target - attn - 2 * hidden) / (3 * hidden)))
    return TinyModelConfig(
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=inter,
        vocab_size=vocab,
    )


def seed_disk(
    cluster: LocalCluster, node: int, model: str, store: Path, manifest: Manifest
) -> None:
    """Make `store`'s blocks appear in `node`'s disk tier as `model` (symlinks, no copies)."""
    dst = cluster.work_dir / f"node{node}" / model
    dst.mkdir(parents=True)
    for blk in manifest.blocks:
        (dst / blk.file).symlink_to(store / blk.file)
