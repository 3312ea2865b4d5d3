"""`engine/attention.py`: every path (new keys only, a piece after cached tokens in two merged
flash calls, the gathered and masked one) gives a reference softmax attention's numbers, and
the KV cache picks the path without a mask or a gather where it can."""

import pytest
import torch

from surge.engine.attention import attend
from surge.engine.batch import BatchMeta
from surge.engine.kv_cache import PagedKVCache
from surge.engine.model import RopeTable
from surge.model.arch import RopeConfig

HEADS, KV_HEADS, D, PAGE = 4, 2, 8, 4


def _reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: int):
    """Softmax attention of q [Q, heads, d] at positions first.. over keys [K, kv_heads, d]."""
    group = HEADS // KV_HEADS
    k, v = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / D**0.5
    pos = torch.arange(first, first + q.shape[0])
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > pos[:, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _cache() -> tuple[PagedKVCache, RopeTable]:
    cache = PagedKVCache(1, 64, PAGE, KV_HEADS, D, torch.float32, torch.device("cpu"))
    return cache, RopeTable(RopeConfig(), D, torch.device("cpu"), torch.float32)


def _piece(cache: PagedKVCache, rope: RopeTable, batch: BatchMeta, history: dict):
    """Run one step's attention on random q/k/v; returns (output, context, queries)."""
    ctx = cache.prepare(batch, rope)
    B, Q = batch.num_seqs, batch.max_q_len
    q = torch.randn(B, Q, HEADS, D)
    k, v = torch.randn(B, Q, KV_HEADS, D), torch.randn(B, Q, KV_HEADS, D)
    k_new, v_new = k.reshape(-1, KV_HEADS, D), v.reshape(-1, KV_HEADS, D)
    if ctx.valid_index is not None:  # padded rows of shorter sequences are not written
        k_new, v_new = k_new[ctx.valid_index], v_new[ctx.valid_index]
    cache.k[0].index_copy_(0, ctx.write_slots, k_new)
    cache.v[0].index_copy_(0, ctx.write_slots, v_new)
    for b, (sid, n) in enumerate(zip(batch.seq_ids, batch.q_lens, strict=True)):
        hk, hv = history.get(sid, (torch.empty(0, KV_HEADS, D), torch.empty(0, KV_HEADS, D)))
        history[sid] = (torch.cat((hk, k[b, :n])), torch.cat((hv, v[b, :n])))
    return attend(q, k, v, cache.k[0], cache.v[0], ctx), ctx, q


@pytest.mark.parametrize("interleaved", [False, True])
def test_a_piece_after_cached_tokens_matches_reference(interleaved: bool) -> None:
    """Chunked prefill's later pieces: two flash calls merged by log-sum-exp; the earlier
    tokens a view where the pages are consecutive, a gather where another sequence's pages
    sit between them."""
    torch.manual_seed(0)
    cache, rope = _cache()
    history: dict = {}
    first_piece = 6
    _piece(cache, rope, BatchMeta((1,), (0,), (first_piece,)), history)
    if interleaved:  # another sequence takes the next pages: seq 1's later pages jump
        _piece(cache, rope, BatchMeta((2,), (0,), (5,)), history)
    ctx_len = first_piece
    for q_len in (7, 9):
        out, ctx, q = _piece(cache, rope, BatchMeta((1,), (ctx_len,), (q_len,)), history)
        assert ctx.prior_len == ctx_len and ctx.mask is None
        assert (ctx.prior_first_slot is None) == (interleaved and ctx_len > first_piece)
        keys, values = history[1]
        torch.testing.assert_close(out[0], _reference(q[0], keys, values, ctx_len))
        ctx_len += q_len


def test_prompts_from_position_zero_attend_their_own_keys_only() -> None:
    torch.manual_seed(1)
    cache, rope = _cache()
    history: dict = {}
    out, ctx, q = _piece(cache, rope, BatchMeta((1, 2), (0, 0), (5, 5)), history)
    assert ctx.new_keys_only and ctx.mask is None and ctx.gather_pages.numel() == 0
    for b, sid in enumerate((1, 2)):
        keys, values = history[sid]
        torch.testing.assert_close(out[b], _reference(q[b], keys, values, 0))


def test_decode_and_mixed_steps_gather_and_mask() -> None:
    torch.manual_seed(2)
    cache, rope = _cache()
    history: dict = {}
    _piece(cache, rope, BatchMeta((1, 2), (0, 0), (5, 3)), history)  # different lengths
    out, ctx, q = _piece(cache, rope, BatchMeta((1, 2), (5, 3), (1, 1)), history)
    assert not ctx.new_keys_only and ctx.prior_len == 0 and ctx.mask is not None
    for b, (sid, first) in enumerate(((1, 5), (2, 3))):
        keys, values = history[sid]
        torch.testing.assert_close(out[b], _reference(q[b], keys, values, first))
