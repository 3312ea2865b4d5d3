"""`engine/attention.py`: every path (new keys only, a piece after cached tokens in two merged
flash calls, the gathered and masked one) gives a reference softmax attention's numbers, and
the KV cache picks the path without a mask or a gather where it can."""

import pytest
import torch
import torch.nn.functional as F

from surge.engine import gemv
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


@pytest.mark.parametrize("direct", [False, True], ids=["gathered", "from-pages"])
def test_decode_and_mixed_steps_gather_and_mask(direct: bool, monkeypatch) -> None:
    """Decode steps read the paged cache directly (`surge::decode_attention`) where surge's
    kernels are built, else gather and mask; mixed steps always gather and mask. Both give
    the reference's numbers, here with GQA and sequences whose pages interleave."""
    if direct and not gemv.load():
        pytest.skip("surge's CPU kernels are not built here (./setup.sh builds them)")
    monkeypatch.setattr(gemv, "loaded", lambda: direct)
    torch.manual_seed(2)
    cache, rope = _cache()
    history: dict = {}
    _piece(cache, rope, BatchMeta((1, 2), (0, 0), (5, 3)), history)  # different lengths
    lens = {1: 5, 2: 3}
    for _ in range(PAGE + 2):  # decode steps crossing pages, each sequence's pages apart
        out, ctx, q = _piece(cache, rope, BatchMeta((1, 2), (lens[1], lens[2]), (1, 1)), history)
        assert not ctx.new_keys_only and ctx.prior_len == 0
        assert (ctx.key_lens is not None, ctx.mask is None) == (direct, direct)
        for b, sid in enumerate((1, 2)):
            keys, values = history[sid]
            torch.testing.assert_close(out[b], _reference(q[b], keys, values, lens[sid]))
            lens[sid] += 1
    # A mixed step (one decoding, one prefilling) gathers and masks either way.
    out, ctx, q = _piece(cache, rope, BatchMeta((1, 3), (lens[1], 0), (1, 4)), history)
    assert ctx.key_lens is None and ctx.mask is not None
    keys, values = history[1]
    torch.testing.assert_close(out[0, :1], _reference(q[0, :1], keys, values, lens[1]))


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d"),
    [(9, 3, 64), (8, 2, 128), (4, 4, 80), (6, 2, 40)],
    ids=["smollm2", "llama-128", "d80-mha", "d40-avx2"],
)
def test_the_decode_kernel_matches_the_gathered_path_at_real_widths(
    heads: int, kv_heads: int, d: int
) -> None:
    """At SmolLM2's head layout (9 heads over 3 kv heads, d 64), Llama's d 128 over 4 query
    heads per kv head, a d of 80 (AVX-512's 64-float output pass and a 16-float remainder)
    and a d of 40 (no multiple of 16: the AVX2 loops), for contexts of 0 to 300 keys over
    scattered page tables, the kernel gives SDPA's numbers over the gathered keys (zeros
    for an empty context)."""
    if not gemv.load():
        pytest.skip("surge's CPU kernels are not built here (./setup.sh builds them)")
    torch.manual_seed(3)
    page = 16
    k_cache, v_cache = torch.randn(2, 40 * page, kv_heads, d).unbind(0)
    lens = torch.tensor([1, 17, 300, 64, 0])
    pages = torch.stack([torch.randperm(40)[:20] for _ in lens])  # scattered page tables
    q = torch.randn(len(lens), heads, d)
    got = torch.ops.surge.decode_attention(q, k_cache, v_cache, pages, lens, page, d**-0.5)
    for b, n in enumerate(lens.tolist()):
        if n == 0:
            assert torch.equal(got[b], torch.zeros(heads, d))
            continue
        slots = (pages[b, :, None] * page + torch.arange(page)).flatten()[:n]
        keys = k_cache[slots].repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
        values = v_cache[slots].repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
        want = F.scaled_dot_product_attention(q[b, :, None], keys, values)[:, 0]
        torch.testing.assert_close(got[b], want)
