"""What a decode graph computes and which shapes it is compiled for (`surge.engine.compiled`
compiles them in the background): the eager layer stack and whole model that dynamo traces,
the batch classes that share a graph, and the sizes marked dynamic. Owned by the engine.
"""

import torch

from surge.engine import gemv
from surge.engine.attention import AttnContext
from surge.engine.model import HeadWeights, LayerWeights, decoder_layer, final_logits
from surge.model.arch import ModelArch


def decode_stack(
    x: torch.Tensor,
    layers: tuple[LayerWeights, ...],
    arch: ModelArch,
    ctx: AttnContext,
    k_caches: tuple[torch.Tensor, ...],
    v_caches: tuple[torch.Tensor, ...],
) -> torch.Tensor:
    """The eager layers, one after another (dynamo unrolls the loop into one graph)."""
    for w, k_cache, v_cache in zip(layers, k_caches, v_caches, strict=True):
        x = decoder_layer(x, w, arch, ctx, k_cache, v_cache)
    return x


def decode_model(
    token_ids: torch.Tensor,
    embedding: torch.Tensor,
    layers: tuple[LayerWeights, ...],
    head: HeadWeights,
    arch: ModelArch,
    ctx: AttnContext,
    k_caches: tuple[torch.Tensor, ...],
    v_caches: tuple[torch.Tensor, ...],
) -> torch.Tensor:
    """Token ids [B, 1] -> float32 logits [B, vocab]: embedding, every layer, final norm and
    lm_head in one graph (a runner that holds the whole model)."""
    x = decode_stack(embedding[token_ids], layers, arch, ctx, k_caches, v_caches)
    return final_logits(x[:, -1], head, arch)


STACK, MODEL = "stack", "model"
"""What a graph computes: a stage's layers (hidden in and out) or the whole model (ids to
logits)."""

CompileJob = tuple[str, int]
"""(STACK or MODEL, batch size class: 1; 2 standing for 2 to `gemv.max_rows()`; and
`gemv.max_rows() + 1` for every larger batch)."""


def batch_class(batch_size: int) -> int:
    """Batch 1 has its own graphs (one-row projections); batches of 2 to `gemv.max_rows()`
    share one (surge's kernel, `engine/gemv.py`; its graph guards on the batch being at most
    that), larger ones another (oneDNN's packed projections). One graph for every batch >= 2
    would guard on the kernel's rows, and batches above them would refuse forever."""
    if batch_size == 1:
        return 1
    return 2 if batch_size <= gemv.max_rows() else gemv.max_rows() + 1


def mark_dynamic(which: str, args: tuple) -> None:
    """Mark the sizes that move from step to step (size-1 dims, batch 1, stay specialized)."""
    ctx = args[-3]
    assert isinstance(ctx, AttnContext)
    torch._dynamo.maybe_mark_dynamic(args[0], 0)  # token ids or hidden states: the batch
    for t in (ctx.cos, ctx.sin, ctx.write_slots, ctx.gather_pages):
        torch._dynamo.maybe_mark_dynamic(t, 0)
    torch._dynamo.maybe_mark_dynamic(ctx.gather_pages, 1)
    if ctx.key_lens is not None:
        torch._dynamo.maybe_mark_dynamic(ctx.key_lens, 0)
    if ctx.mask is not None:
        torch._dynamo.maybe_mark_dynamic(ctx.mask, 0)
        torch._dynamo.maybe_mark_dynamic(ctx.mask, 3)
