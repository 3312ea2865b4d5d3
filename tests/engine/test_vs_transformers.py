"""Greedy generation from a store equals transformers' generate, token for token (float32)."""

from pathlib import Path

import pytest

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.model.importer import import_checkpoint
from tests.engine.reference import assert_same_tokens, hf_greedy

MAX_NEW = 24
PROMPTS = [
    [0, 5, 9, 200, 31, 17, 4],
    [0, 8],
    [0, 3, 44, 55, 66, 77, 88, 99, 100, 101, 102, 103, 7, 6, 5, 4, 3, 2],
    [0, 250, 251],
]


@pytest.fixture(params=["tiny_hf", "qwen2_hf", "llama3_hf"])
def hf_and_store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    hf_dir = request.getfixturevalue(request.param)
    import_checkpoint(hf_dir, tmp_path / "store", num_blocks=2, progress=False)
    return hf_dir, tmp_path / "store"


def test_batch_of_one_matches(hf_and_store: tuple[Path, Path]) -> None:
    hf_dir, store = hf_and_store
    engine = LLMEngine.from_store(store)
    for prompt in PROMPTS:
        (out,) = engine.generate([prompt], SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
        ref, logits = hf_greedy(hf_dir, prompt, MAX_NEW)
        assert_same_tokens(out.token_ids, ref, logits, f"{hf_dir.parent.name} prompt {prompt[:3]}")


@pytest.mark.parametrize("page_size", [16, 4])
def test_batch_of_different_lengths_matches(
    hf_and_store: tuple[Path, Path], page_size: int
) -> None:
    hf_dir, store = hf_and_store
    engine = LLMEngine.from_store(store, EngineConfig(page_size_tokens=page_size))
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ref, logits = hf_greedy(hf_dir, prompt, MAX_NEW)
        assert_same_tokens(out.token_ids, ref, logits, f"{hf_dir.parent.name} batched {prompt[:3]}")
