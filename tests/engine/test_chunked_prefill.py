"""Chunked prefill: a long prompt prefilled in pieces gives the same tokens, and running
sequences keep decoding between its pieces."""

from pathlib import Path

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams

LONG = [(7 * i + 3) % 250 for i in range(61)]
SHORT = [0, 5, 9, 200]
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


def _engine(store: Path, chunk: int) -> LLMEngine:
    # Caching off: every piece is computed, none reused.
    cfg = EngineConfig(prefill_chunk_tokens=chunk, enable_prefix_caching=False)
    return LLMEngine.from_store(store, cfg)


def test_pieces_give_the_same_tokens(tiny_store: Path) -> None:
    whole = _engine(tiny_store, 0).generate([LONG, SHORT], GREEDY)
    engine = _engine(tiny_store, 8)
    sid = engine.add_request(LONG, GREEDY)
    engine.step()  # nothing decodes: no stall to bound, the prompt runs in one piece
    assert engine.seqs[sid].output_token_ids
    busy = _engine(tiny_store, 8)
    busy.add_request(SHORT, SamplingParams(max_tokens=40, ignore_eos=True))
    busy.step()  # SHORT's prefill; from now on it decodes
    sid = busy.add_request(LONG, GREEDY)
    steps = 0
    while not busy.seqs[sid].output_token_ids:
        busy.step()
        steps += 1
    assert steps == 2 * 8 - 1  # 61 tokens in pieces of 8, a decode between pieces
    while busy.has_unfinished:
        busy.step()
    assert busy.seqs[sid].output_token_ids == whole[0].token_ids
    pieces = engine.generate([LONG, SHORT], GREEDY)
    assert [o.token_ids for o in pieces] == [o.token_ids for o in whole]


def test_decodes_run_between_pieces(tiny_store: Path) -> None:
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    alone = _engine(tiny_store, 0).generate([SHORT], params)[0].token_ids
    engine = _engine(tiny_store, 8)
    short = engine.add_request(SHORT, params)
    engine.step()  # the short request's prefill
    long = engine.add_request(LONG, GREEDY)
    gaps, since = [], 0
    while not engine.seqs[long].output_token_ids:
        events = engine.step()
        since += 1
        if any(e.seq_id == short for e in events):
            gaps.append(since)
            since = 0
    # Unchunked, the short request would wait out the whole prompt in one step; chunked, it
    # gets a token at least every other step while the 8 pieces run.
    assert len(gaps) >= 7 and max(gaps) <= 2
    while engine.has_unfinished:
        engine.step()
    assert engine.seqs[short].output_token_ids == alone
