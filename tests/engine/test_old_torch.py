"""surge runs on the torch a machine has (>= 2.4): where SDPA lacks `enable_gqa` (torch 2.4),
GQA attention repeats keys and values per query head and gives the same tokens."""

from pathlib import Path

import pytest

import surge.engine.attention as engine_attention
from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.model.manifest import read_manifest


def _greedy(store: Path) -> list[list[int]]:
    engine = LLMEngine(read_manifest(store), EngineConfig(device="cpu"))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in engine.generate([[0, 5, 9, 33], [7, 7, 100]], params)]


def test_gqa_without_enable_gqa_gives_the_same_tokens(
    tiny_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert read_manifest(tiny_store).arch.num_kv_heads < read_manifest(tiny_store).arch.num_heads
    with_gqa = _greedy(tiny_store)
    monkeypatch.setattr(engine_attention, "SDPA_HAS_GQA", False)
    assert _greedy(tiny_store) == with_gqa
