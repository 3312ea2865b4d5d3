"""Automatic prefix caching: hits are token-exact, eviction never takes a page in use, and KV
export/import stays correct when a sequence's pages are shared."""

from pathlib import Path

import pytest
import torch

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.engine.page_pool import OutOfPagesError, PagePool, block_hashes
from surge.engine.sampling import SamplingParams

SHARED = [0, 11, 23, 5, 77, 8, 90, 31, 4, 4, 61, 2, 19, 250, 7, 42, 13, 99, 3, 56]  # 20 tokens
PROMPTS = [[*SHARED, 5, 6, 7], [*SHARED, 100, 101], [*SHARED, 200, 9, 9, 9, 1], SHARED[:9]]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
PAGE = 4


def _engine(store: Path, caching: bool, **kw: int) -> LLMEngine:
    cfg = EngineConfig(page_size_tokens=PAGE, enable_prefix_caching=caching, **kw)
    return LLMEngine.from_store(store, cfg)


@pytest.fixture(scope="module")
def uncached(tiny_store: Path) -> list[list[int]]:
    """Each prompt's greedy tokens, caching off, one request at a time."""
    engine = _engine(tiny_store, caching=False)
    return [engine.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


def test_block_hashes_chain_the_prefix() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and len(b) == 2  # only full blocks
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different prefix
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, a[:1]) == a  # extends a known prefix


def test_eviction_never_takes_a_page_in_use() -> None:
    pool = PagePool(6)
    held = pool.allocate(3)  # a running sequence
    for i, page in enumerate(held):
        pool.register(page, 100 + i)
    done = pool.allocate(3)  # a finished one, its blocks cached
    for i, page in enumerate(done):
        pool.register(page, 200 + i)
    pool.release(list(reversed(done)))
    assert pool.num_free == 3 and pool.num_cached == 6
    shared = pool.claim([200, 201, 999])  # a new sequence reuses two cached blocks
    assert shared == done[:2] and pool.num_free == 1
    taken = pool.allocate(1)  # must evict: only the unreferenced cached page may go
    assert taken == [done[2]] and pool.cached_prefix([200, 201, 202]) == 2
    with pytest.raises(OutOfPagesError):
        pool.allocate(1)
    assert all(pool.refs(p) == 1 for p in held) and pool.cached_prefix([100, 101, 102]) == 3
    pool.release(shared + taken + held)
    assert pool.num_free == 6


def test_hits_are_token_exact(tiny_store: Path, uncached: list[list[int]]) -> None:
    engine = _engine(tiny_store, caching=True)
    outs = [engine.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    assert outs == uncached
    s = engine.scheduler
    # The 2nd and 3rd prompts reuse the shared 20 tokens (5 blocks); the 4th its first 2 blocks.
    assert s.prefix_hit_tokens == 2 * 20 + 8
    assert s.prefix_query_tokens == sum(len(p) for p in PROMPTS)
    # A whole prompt cached: its last token is still computed (its logits give a token).
    again = engine.generate([PROMPTS[0]], GREEDY)[0].token_ids
    assert again == uncached[0]
    assert engine.scheduler.prefix_hit_tokens == 48 + 20


def test_batched_and_preempted_hits_are_token_exact(
    tiny_store: Path, uncached: list[list[int]]
) -> None:
    # A cache of 64 tokens cannot hold four ~35-token sequences: preemption recomputes some,
    # from their own cached blocks; every page comes back at the end.
    engine = _engine(tiny_store, caching=True, max_kv_tokens=64)
    engine.generate([PROMPTS[0]], GREEDY)
    outs = engine.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == uncached
    assert engine.scheduler.prefix_hit_tokens > 0
    kv = engine.executor.runner.kv
    assert kv.num_free_pages == kv.num_pages
    assert all(kv.pool.refs(p) == 0 for p in range(kv.num_pages))


def test_hits_reach_the_token_events_and_metrics(tiny_store: Path) -> None:
    from surge.control.metrics import Metrics

    engine = _engine(tiny_store, caching=True)
    engine.generate([PROMPTS[0]], GREEDY)
    sid = engine.add_request(PROMPTS[1], GREEDY)
    first, second = engine.step(), engine.step()
    assert [(e.seq_id, e.num_cached_tokens) for e in first] == [(sid, 20)]
    assert [e.num_cached_tokens for e in second] == [None]  # decode tokens carry nothing
    m = Metrics()
    m.record_prefix_cache("m", len(PROMPTS[1]), first[0].num_cached_tokens or 0)
    m.record_prefix_cache("m", 10, 0)
    text = m.render().decode()
    assert 'vllm:prefix_cache_hits_total{model_name="m"} 20.0' in text
    assert 'vllm:prefix_cache_queries_total{model_name="m"} 32.0' in text
    assert 'surge_prefix_cache_hit_rate{model="m"} 0.625' in text


def test_kv_export_import_with_shared_pages(tiny_store: Path, uncached: list[list[int]]) -> None:
    src = _engine(tiny_store, caching=True)
    src.generate([PROMPTS[0]], GREEDY)
    sid = src.add_request(PROMPTS[1], GREEDY)
    for _ in range(4):
        src.step()
    seq = src.seqs[sid]
    assert seq.num_prefix_hit_tokens == 20  # its first 5 pages are shared cached pages
    n = seq.num_tokens - 1
    kv = src.executor.runner.export_kv(sid, n)
    # The same tokens' K/V computed without any caching.
    plain = _engine(tiny_store, caching=False)
    pid = plain.add_request(PROMPTS[1], GREEDY)
    for _ in range(4):
        plain.step()
    torch.testing.assert_close(kv, plain.executor.runner.export_kv(pid, n))
    # Migrate it (KV migration): decoding goes on with the same tokens as never migrated.
    dst = _engine(tiny_store, caching=True)
    dst.generate([PROMPTS[2]], GREEDY)  # the destination's cache holds other cached blocks
    src.abort(sid)
    new = dst.adopt(seq.prompt_token_ids, GREEDY, seq.output_token_ids, n)
    dst.executor.runner.import_kv(new, 0, kv)
    while dst.has_unfinished:
        dst.step()
    assert dst.seqs[new].output_token_ids == uncached[1]
