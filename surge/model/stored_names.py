"""Which tensors a store holds: HF's, except q|k|v and gate|up, each stored as ONE tensor.

Store version 3 writes a layer's q, k and v projections as `self_attn.qkv_proj` (weights, and
biases where the model has them) and gate, up as `mlp.gate_up_proj`: their outputs side by
side, [q_out + k_out + v_out, in] and [2 * intermediate, in], stored transposed like every
projection ([in, out] contiguous, `surge.model.importer.stores_transposed`). The engine then
computes q, k and v with one matmul straight from the block buffer (zero copies), which it
used to get by copying ~2/3 of each layer's bytes after the block landed. Where the parts'
outputs split is derived from the arch (`split_sizes`), not stored. Stores of versions 1-2
hold the separate HF tensors; readers handle both (`surge.engine.model.LayerWeights`).
Written by the importer; read by the engine.
"""

from surge.errors import SurgeError
from surge.model.arch import ModelArch, layer_prefix, layer_tensor_names

QKV = "self_attn.qkv_proj"
GATE_UP = "mlp.gate_up_proj"
FUSED_PARTS: dict[str, tuple[str, ...]] = {
    QKV: ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    GATE_UP: ("mlp.gate_proj", "mlp.up_proj"),
}
"""Stored projection -> the HF projections whose outputs it concatenates, in order."""
_FUSED_OF = {part: fused for fused, parts in FUSED_PARTS.items() for part in parts}


def split_sizes(arch: ModelArch, fused: str) -> tuple[int, ...]:
    """Output rows of each part of fused projection `fused` (QKV or GATE_UP)."""
    if fused == QKV:
        q_out, kv_out = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        return (q_out, kv_out, kv_out)
    if fused == GATE_UP:
        return (arch.intermediate_size, arch.intermediate_size)
    raise ValueError(f"{fused!r} is not a fused projection")


def check_fused_rows(arch: ModelArch, stored: str, part_rows: list[int]) -> None:
    """Raise a `SurgeError` unless the parts of fused tensor `stored` have the output rows the
    arch says (readers split it by `split_sizes`, so a mismatch would mis-split silently)."""
    proj = stored.rpartition(".")[0].partition(".layers.")[2].partition(".")[2]
    want = list(split_sizes(arch, proj))
    if part_rows != want:
        raise SurgeError(
            f"{stored}: its parts have {part_rows} output rows, but config.json's heads, "
            f"head_dim and intermediate_size give {want}; is config.json this checkpoint's?"
        )


def _stored_name(hf_name: str, layer: int) -> str:
    """`hf_name`'s stored tensor: its fused projection's, else itself."""
    p = layer_prefix(layer)
    proj, _, kind = hf_name.removeprefix(p).rpartition(".")
    return p + _FUSED_OF[proj] + "." + kind if proj in _FUSED_OF else hf_name


def stored_layer_sources(
    arch: ModelArch, layer: int, fuse: bool = True
) -> dict[str, tuple[str, ...]]:
    """Stored tensor name -> the HF tensors it is made of (one, or the parts to concatenate
    along the output dimension), in packing order. `fuse=False`: the version-2 layout
    (every HF tensor on its own)."""
    out: dict[str, tuple[str, ...]] = {}
    for name in layer_tensor_names(arch, layer):
        stored = _stored_name(name, layer) if fuse else name
        out[stored] = (*out.get(stored, ()), name)
    return out
