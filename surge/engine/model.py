"""The Llama-family transformer, as plain functions over weight tensors (gpt-fast style).

Weights are views into block buffers (no copies, no nn.Module parameters), so a layer is
usable the moment its block lands. Flow: token ids -> `embed` -> `decoder_layer` xN ->
`final_logits`. Attention reads and writes the paged KV cache through an `AttnContext`
built once per step. Math matches Hugging Face's Llama/Qwen2/Mistral (RMSNorm in float32,
rotate-half RoPE with cos/sin computed in float32, SwiGLU MLP).
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from surge.engine.attention import AttnContext, attend
from surge.engine.linear import Linear, fuse_linears, split_linear
from surge.model.arch import (
    EMBED_NAME,
    FINAL_NORM_NAME,
    LM_HEAD_NAME,
    ModelArch,
    RopeConfig,
    layer_prefix,
)
from surge.model.stored_names import GATE_UP, QKV, split_sizes


@dataclass(frozen=True)
class LayerWeights:
    """The projections and norms of one decoder layer (`Linear` holds weight, bias, packing).

    Fused: `qkv` computes q, k and v in one matmul and `gate_up` gate and up in one; q, k, v,
    gate, up are None. Unfused: the reverse. Every weight is a view of the block buffer as a
    block lands: a version-3 store holds q|k|v and gate|up fused (`surge.model.
    stored_names`), so a layer is fused at once, or split into column views of the fused
    matrices with `EngineConfig.fuse_projections` off. An older store's layer lands unfused
    and `fused()` (the runner calls it gradually) copies its parts into fused matrices
    (`surge.engine.linear.fuse_linears`).
    """

    input_norm: torch.Tensor
    qkv: Linear | None
    q: Linear | None
    k: Linear | None
    v: Linear | None
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear | None
    gate: Linear | None
    up: Linear | None
    down: Linear

    @property
    def projection_names(self) -> tuple[str, ...]:
        """The fields holding a `Linear` (4 fused, 7 unfused), for whoever packs them."""
        names = ("qkv", "q", "k", "v", "o", "gate_up", "gate", "up", "down")
        return tuple(n for n in names if getattr(self, n) is not None)

    @property
    def is_fused(self) -> bool:
        return self.qkv is not None

    @property
    def fusable_bytes(self) -> int:
        """Bytes `fused()` copies (0 once fused)."""
        parts = (self.q, self.k, self.v, self.gate, self.up)
        return sum(p.num_bytes for p in parts if p is not None)

    def fused(self) -> "LayerWeights":
        """This layer with q|k|v and gate|up as one projection each (unpacked copies; an
        older store's layers)."""
        if self.is_fused:
            return self
        assert self.q is not None and self.k is not None and self.v is not None
        assert self.gate is not None and self.up is not None
        return replace(
            self,
            qkv=fuse_linears((self.q, self.k, self.v)),
            q=None,
            k=None,
            v=None,
            gate_up=fuse_linears((self.gate, self.up)),
            gate=None,
            up=None,
        )

    def split(self, arch: ModelArch) -> "LayerWeights":
        """This (unpacked) layer with q, k, v, gate and up as views of the fused matrices."""
        if not self.is_fused:
            return self
        assert self.qkv is not None and self.gate_up is not None
        q, k, v = split_linear(self.qkv, split_sizes(arch, QKV))
        gate, up = split_linear(self.gate_up, split_sizes(arch, GATE_UP))
        return replace(self, qkv=None, q=q, k=k, v=v, gate_up=None, gate=gate, up=up)

    @staticmethod
    def from_tensors(
        tensors: dict[str, torch.Tensor], layer: int, arch: ModelArch, fuse: bool = True
    ) -> "LayerWeights":
        """Layer `layer`'s weights from a block's tensors (views, unpacked): fused when the
        store holds q|k|v and gate|up fused, split into views of them if not `fuse`; an older
        store's separate tensors as they are (unfused)."""
        p = layer_prefix(layer)

        def proj(name: str) -> Linear:
            return Linear.of(tensors[p + name + ".weight"], tensors.get(p + name + ".bias"))

        if p + QKV + ".weight" in tensors:
            fused = LayerWeights(
                input_norm=tensors[p + "input_layernorm.weight"],
                qkv=proj(QKV),
                q=None,
                k=None,
                v=None,
                o=proj("self_attn.o_proj"),
                post_norm=tensors[p + "post_attention_layernorm.weight"],
                gate_up=proj(GATE_UP),
                gate=None,
                up=None,
                down=proj("mlp.down_proj"),
            )
            return fused if fuse else fused.split(arch)
        return LayerWeights(
            input_norm=tensors[p + "input_layernorm.weight"],
            qkv=None,
            q=proj("self_attn.q_proj"),
            k=proj("self_attn.k_proj"),
            v=proj("self_attn.v_proj"),
            o=proj("self_attn.o_proj"),
            post_norm=tensors[p + "post_attention_layernorm.weight"],
            gate_up=None,
            gate=proj("mlp.gate_proj"),
            up=proj("mlp.up_proj"),
            down=proj("mlp.down_proj"),
        )


@dataclass(frozen=True)
class HeadWeights:
    """Final norm and output projection (the last block)."""

    norm: torch.Tensor
    lm_head: Linear

    @staticmethod
    def from_tensors(tensors: dict[str, torch.Tensor]) -> "HeadWeights":
        return HeadWeights(norm=tensors[FINAL_NORM_NAME], lm_head=Linear.of(tensors[LM_HEAD_NAME]))


def embedding_of(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return tensors[EMBED_NAME]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as Hugging Face computes it (normalise in float32, cast, then scale)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused kernel, same math
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse rotary frequencies [head_dim / 2], with linear or Llama 3 scaling."""
    inv_freq = 1.0 / (
        rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    )
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        # Llama 3.1: keep high frequencies, scale low ones by `factor`, blend in between.
        old_len = rope.original_max_position_embeddings
        low_wavelen = old_len / rope.low_freq_factor
        high_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


class RopeTable:
    """cos/sin of every position in the model's dtype, sign-folded for `apply_rope`, grown on
    demand (a full 128k table would waste memory). Built once, so a step's rope is two row
    lookups, not a lookup, a sign flip and two casts per step."""

    def __init__(
        self, rope: RopeConfig, head_dim: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.inv_freq = rope_inv_freq(rope, head_dim).to(device)
        self.dtype = dtype
        empty = torch.empty(0, head_dim, device=device, dtype=dtype)
        self.tables: tuple[torch.Tensor, torch.Tensor] = (empty, empty)
        """(cos, sin_signed) [positions, head_dim], replaced whole when grown."""

    def lookup(self, positions: torch.Tensor, max_position: int) -> tuple[torch.Tensor, ...]:
        """cos, sin_signed [*positions.shape, 1, head_dim] of `positions` (all <=
        `max_position`), ready for `apply_rope` on [..., heads, head_dim]."""
        # One read of the pair: the decode graphs' compile thread looks up too, and a table
        # another thread swaps in mid-call must not be mixed with the one checked.
        cos, sin_signed = self.tables
        if max_position >= cos.shape[0]:
            n = max(max_position + 1, 2 * cos.shape[0], 256)
            t = torch.arange(n, device=self.inv_freq.device, dtype=torch.int64).float()
            freqs = torch.outer(t, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin_signed = rope_tables(emb.cos(), emb.sin(), self.dtype)
            if cos.shape[0] > self.tables[0].shape[0]:
                self.tables = (cos, sin_signed)
        return cos[positions].unsqueeze(-2), sin_signed[positions].unsqueeze(-2)


def rope_tables(
    cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., d] float32 -> the same in `dtype`, with sin's first half negated.

    HF rotates with x * cos + cat(-x2, x1) * sin. Folding the sign into sin turns that into
    x * cos + roll(x, d/2) * sin_signed: the same products, two fewer ops per call.
    """
    half = sin.shape[-1] // 2
    sin_signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos.to(dtype), sin_signed.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate [B, Q, heads, d] by [B, Q, 1, d] rows of a `RopeTable`."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


def decoder_layer(
    x: torch.Tensor,
    w: LayerWeights,
    arch: ModelArch,
    ctx: AttnContext,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> torch.Tensor:
    """One pre-norm decoder layer on hidden states [B, Q, hidden]; updates the KV cache."""
    B, Q, _ = x.shape
    nh, nkv, d = arch.num_heads, arch.num_kv_heads, arch.head_dim
    h = rms_norm(x, w.input_norm, arch.rms_norm_eps)
    if w.qkv is not None:
        # q and k heads sit side by side in the fused output: rotate them in one pass.
        qkv = w.qkv(h).view(B, Q, nh + 2 * nkv, d)
        qk = apply_rope(qkv[:, :, : nh + nkv], ctx.cos, ctx.sin)
        q, k, v = qk[:, :, :nh], qk[:, :, nh:], qkv[:, :, nh + nkv :]
    else:
        assert w.q is not None and w.k is not None and w.v is not None
        q = apply_rope(w.q(h).view(B, Q, nh, d), ctx.cos, ctx.sin)
        k = apply_rope(w.k(h).view(B, Q, nkv, d), ctx.cos, ctx.sin)
        v = w.v(h).view(B, Q, nkv, d)

    k_new, v_new = k.reshape(B * Q, nkv, d), v.reshape(B * Q, nkv, d)
    if ctx.valid_index is not None:
        k_new, v_new = k_new[ctx.valid_index], v_new[ctx.valid_index]
    k_cache.index_copy_(0, ctx.write_slots, k_new)
    v_cache.index_copy_(0, ctx.write_slots, v_new)
    attn = attend(q, k, v, k_cache, v_cache, ctx)
    x = x + w.o(attn.reshape(B, Q, nh * d))
    h = rms_norm(x, w.post_norm, arch.rms_norm_eps)
    if w.gate_up is not None:
        gate, up = w.gate_up(h).chunk(2, dim=-1)
    else:
        assert w.gate is not None and w.up is not None
        gate, up = w.gate(h), w.up(h)
    return x + w.down(F.silu(gate) * up)


def final_logits(x: torch.Tensor, head: HeadWeights, arch: ModelArch) -> torch.Tensor:
    """Logits in float32 for hidden states [..., hidden]."""
    return head.lm_head(rms_norm(x, head.norm, arch.rms_norm_eps)).float()
