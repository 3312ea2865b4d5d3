"""Attention over the paged KV cache: the per-step `AttnContext` and `attend`.

What flows: `PagedKVCache.prepare` (engine/kv_cache.py) turns a step's `BatchMeta` into one
`AttnContext`; every decoder layer (`surge.engine.model.decoder_layer`) writes its new keys
and values into its cache and calls `attend` with them. Owned by the engine.

Three shapes of step, three paths (each picks ATen's SDPA, whose CPU kernel is flash-style:
blocked over keys with an online softmax, so nothing of size queries x keys is stored):
- *New keys only* (every sequence starts at position 0 with the same number of new tokens:
  a whole prompt, or equal prompts together): causal SDPA over the step's own keys; the cache
  is written but not read back, and no mask is built.
- *A piece after cached tokens* (one sequence, several new tokens, `ctx_len` > 0: a chunk of a
  chunked prefill, or a prompt after a prefix-cache hit), on CPU: the piece attends its earlier
  tokens and itself in two flash calls, merged by their log-sum-exps. The earlier tokens are a
  view of the cache where the sequence's pages are consecutive (the usual case: pages are
  handed out in order), else one gather; no mask, and the causal part skips the blocks
  above the diagonal. A masked call over everything instead built a [Q, K] mask and
  gathered every key again on each piece, so an 8,000-token prompt in 512-token pieces
  re-read its whole cache 16 times (Sarathi-Serve §4 chunks without that cost).
- *Decode on CPU* (every sequence one new token, float32, surge's kernels built:
  `key_lens` set): `surge::decode_attention` (csrc/decode_attention.cpp) reads each
  sequence's keys and values where they sit in the paged cache, through its page table, as
  vLLM's PagedAttention does (Kwon et al. SOSP'23 §4): no gathered copy of the context per
  layer, no mask, one op instead of ~8 (two gathers, transposes, the mask, SDPA), eager or
  inside the compiled decode graph.
- *Everything else* (mixed lengths, CUDA, no kernel): each sequence's pages gathered a page
  at a time, padding masked (the compiled decode step attends whole pages, `num_keys` None).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SDPA_HAS_GQA = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 5)
"""`scaled_dot_product_attention(enable_gqa=)` came in torch 2.5; on 2.4 (the oldest torch surge
runs on) keys and values are repeated per query head instead (the same numbers, more memory)."""


@dataclass
class AttnContext:
    """Per-step attention plumbing shared by every layer of a range (built by the KV cache).

    The batch is padded to [B, Q] query tokens; keys are gathered from the cache to [B, K].
    """

    cos: torch.Tensor
    """[B, Q, 1, head_dim] rotary cosines of each query position (in the model's dtype)."""
    sin: torch.Tensor
    """[B, Q, 1, head_dim] rotary sines, sign-folded for `apply_rope`."""
    write_slots: torch.Tensor
    """[N] cache slots that receive the N valid new tokens' keys and values."""
    valid_index: torch.Tensor | None
    """[N] indices of the valid tokens in the flattened [B*Q] batch; None if all are valid."""
    gather_pages: torch.Tensor
    """[B, P] cache pages holding the keys each sequence attends to, in order (padded with
    page 0); gathered whole, since one copy of a page is far cheaper than one per slot. With
    `prior_len`: the pages of the earlier tokens only."""
    page_size_tokens: int
    """Slots per cache page."""
    num_keys: int | None
    """K: keys attended per sequence after the gather (the longest sequence's length); None:
    every gathered slot, K = pages * page size (the compiled decode step: no int that changes
    every step in its graph; the mask hides the padding)."""
    mask: torch.Tensor | None
    """[B, 1, Q, K] boolean: query i of sequence b may attend key j; None for one causal seq."""
    new_keys_only: bool = False
    """Every sequence attends exactly this step's new tokens, causally (all start at 0 with
    Q tokens): SDPA over the new keys, nothing read from the cache."""
    prior_len: int = 0
    """> 0: one sequence's piece of Q tokens after this many cached ones (CPU): two flash
    calls, earlier tokens and the piece itself, merged (`attend`)."""
    prior_first_slot: int | None = None
    """With `prior_len`: the earlier tokens sit in consecutive slots from this one (a view of
    the cache); None: gather `gather_pages`."""
    key_lens: torch.Tensor | None = None
    """[B] int64: keys each sequence attends, its new token's included (a decode step read
    straight from the paged cache through `gather_pages`, `surge::decode_attention`); None:
    the other paths."""


def gather_keys(cache: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
    """[B, K, kv_heads, d] of one layer's cache [slots, kv_heads, d], gathered page by page."""
    B, heads_dims = ctx.gather_pages.shape[0], cache.shape[1:]
    pages = cache.view(-1, ctx.page_size_tokens, *heads_dims)
    gathered = pages.index_select(0, ctx.gather_pages.view(-1)).view(B, -1, *heads_dims)
    return gathered if ctx.num_keys is None else gathered[:, : ctx.num_keys]


def _gqa(keys: torch.Tensor, values: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, ...]:
    """Keys and values [B, kv_heads, K, d] as SDPA on this torch takes them."""
    if SDPA_HAS_GQA or keys.shape[1] == num_heads:
        return keys, values
    group = num_heads // keys.shape[1]
    return keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)


def _prior(cache: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
    """[1, prior_len, kv_heads, d]: the piece's earlier tokens (a view where consecutive)."""
    if ctx.prior_first_slot is not None:
        first = ctx.prior_first_slot
        return cache[first : first + ctx.prior_len].unsqueeze(0)
    return gather_keys(cache, ctx)[:, : ctx.prior_len]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx: AttnContext,
) -> torch.Tensor:
    """Attention of queries q [B, Q, heads, d] given this step's keys and values k, v
    [B, Q, kv_heads, d] (already written to the caches [slots, kv_heads, d]): [B, Q, heads, d]."""
    nh, nkv = q.shape[2], k.shape[2]
    if ctx.key_lens is not None:  # decode: keys and values read where they sit in the cache
        out = torch.ops.surge.decode_attention(
            q[:, 0], k_cache, v_cache, ctx.gather_pages, ctx.key_lens,
            ctx.page_size_tokens, q.shape[-1] ** -0.5,
        )  # fmt: skip
        return out.unsqueeze(1)
    gqa = {"enable_gqa": nh != nkv} if SDPA_HAS_GQA else {}
    qt = q.transpose(1, 2)
    if ctx.new_keys_only:
        keys, values = _gqa(k.transpose(1, 2), v.transpose(1, 2), nh)
        out = F.scaled_dot_product_attention(qt, keys, values, is_causal=True, **gqa)
        return out.transpose(1, 2)
    if ctx.prior_len:
        # Softmax over earlier keys E and own keys N, from two partial ones: with
        # l = logsumexp of each part's scores, out = (o_E e^l_E + o_N e^l_N) / (e^l_E + e^l_N)
        # = lerp(o_N, o_E, sigmoid(l_E - l_N)).
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        prior_k, prior_v = _prior(k_cache, ctx), _prior(v_cache, ctx)
        keys, values = _gqa(prior_k.transpose(1, 2), prior_v.transpose(1, 2), nh)
        o_prior, l_prior = flash(qt, keys, values, 0.0, False)
        keys, values = _gqa(k.transpose(1, 2), v.transpose(1, 2), nh)
        o_own, l_own = flash(qt, keys, values, 0.0, True)
        weight = torch.sigmoid(l_prior - l_own).unsqueeze(-1).to(o_own.dtype)
        return torch.lerp(o_own, o_prior, weight).transpose(1, 2)
    cached_k, cached_v = gather_keys(k_cache, ctx), gather_keys(v_cache, ctx)
    keys, values = _gqa(cached_k.transpose(1, 2), cached_v.transpose(1, 2), nh)
    out = F.scaled_dot_product_attention(
        qt, keys, values, attn_mask=ctx.mask, is_causal=ctx.mask is None and q.shape[1] > 1, **gqa
    )
    return out.transpose(1, 2)
