"""Shared fixtures: tiny checkpoints made on the fly (random weights, real HF formats)."""

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from surge.config import COMPILE_DECODE_ENV
from surge.model.importer import import_checkpoint
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import TinyModelConfig

REPO = Path(__file__).resolve().parent.parent

# `--dist loadgroup` groups by `xdist_group` again on pytest 9.2 (see the module).
pytest_plugins = ["tests.xdist_groups"]

# Engines run eager in the tests unless one turns compiled decode on: by default each engine,
# agent and stage process would compile its decode graphs in a background thread (~12 s of
# CPU each with a warm cache) beside the test. Inherited by the processes tests start; a run
# with SURGE_COMPILE_DECODE=1 tests everything with it on.
os.environ.setdefault(COMPILE_DECODE_ENV, "0")


def pytest_collection_finish(session: pytest.Session) -> None:
    """The collected suite (test modules, torch, transformers, hypothesis) lives until the
    session ends: frozen, the garbage collector's full passes during the tests skip it
    (they took 8-19% of a pytest worker's CPU)."""
    gc.freeze()


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint with GQA (4 heads, 2 kv heads), made by surge itself."""
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "hf", TinyModelConfig())


@pytest.fixture(scope="session")
def tiny_store(tiny_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-store") / "store"
    import_checkpoint(tiny_hf, out, num_blocks=3, progress=False)
    return out


def _save_hf(model, out: Path, max_shard_size: str | None = None) -> Path:
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    return out


@pytest.fixture(scope="session")
def qwen2_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2 checkpoint (qkv bias, GQA) written by transformers itself, in several shards."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )
    model = Qwen2ForCausalLM(cfg).float()
    _scale_init(model)
    out = _save_hf(model, tmp_path_factory.mktemp("qwen2") / "hf", max_shard_size="150KB")
    assert len(list(out.glob("*.safetensors"))) > 1, "fixture should be sharded"
    return out


@pytest.fixture(scope="session")
def llama3_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama 3 style checkpoint: GQA, llama3 rope scaling, tied embeddings."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    cfg = LlamaConfig(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        # Short original context and head_dim 16, so the scaling changes tokens within a
        # short test (a model that ignored it fails the comparison).
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    model = LlamaForCausalLM(cfg).float()
    _scale_init(model)
    out = _save_hf(model, tmp_path_factory.mktemp("llama3") / "hf")
    cfg_json = json.loads((out / "config.json").read_text())
    assert cfg_json["tie_word_embeddings"] is True
    return out


def _scale_init(model) -> None:
    """Re-draw weights with std 1/sqrt(fan_in) so logits are well separated (few near-ties)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.dim() == 2:
                std = 1.0 if "embed" in name else p.shape[1] ** -0.5
                p.copy_(torch.randn_like(p) * std)
            else:
                p.copy_(torch.randn_like(p) * 0.1)


def run_surge(
    *args: str, env: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run the `surge` CLI in a subprocess (as a user would)."""
    return subprocess.run(
        [sys.executable, "-m", "surge.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
