"""`surge model import SmolLM2…gguf STORE` then `surge generate STORE`: the same greedy tokens
as transformers loading that GGUF (`gguf_file=`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.model.manifest import read_manifest
from surge.model.tokenizer import load_tokenizer
from tests.real.reference import hf_greedy_ids

# A real 135M model on 2 shared cores. One xdist worker runs every test of tests/real, so
# the session fixtures (the GGUF import, transformers loading the GGUF) run once, not once
# per worker.
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("real")]
REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in 1987,",
]
NEW_TOKENS = 16


def test_surge_generate_is_token_exact_with_transformers(smollm2_store: Path, hf_smollm2):
    _, hf_tok = hf_smollm2
    tok = load_tokenizer(smollm2_store / "tokenizer.json")
    engine = LLMEngine(read_manifest(smollm2_store), EngineConfig())
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
    for prompt in PROMPTS:
        ids = tok.encode(prompt).ids
        assert ids == hf_tok(prompt).input_ids, prompt
        (out,) = engine.generate([ids], params)
        ref = hf_greedy_ids(hf_smollm2, ids, NEW_TOKENS)
        # transformers keeps the EOS it stopped at; surge reports it as the finish reason.
        assert out.token_ids == ref[: len(out.token_ids)] and len(ref) - len(out.token_ids) in (
            0,
            1,
        ), (prompt, out.token_ids, ref)


def test_cli_generate_on_the_imported_store(smollm2_store: Path, hf_smollm2):
    _, hf_tok = hf_smollm2
    prompt = PROMPTS[0]
    r = subprocess.run(
        [sys.executable, "-m", "surge.cli", "generate", str(smollm2_store), "--prompt", prompt,
         "--max-tokens", str(NEW_TOKENS), "--json"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    ref = hf_greedy_ids(hf_smollm2, got["prompt_token_ids"], NEW_TOKENS)
    assert got["token_ids"] == ref
    assert got["text"] == hf_tok.decode(ref, skip_special_tokens=True)
    assert got["text"].startswith(" Paris")
