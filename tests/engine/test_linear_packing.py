"""Packed CPU projections (`surge.engine.linear`): used where they should be, same results."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from surge.config import EngineConfig
from surge.engine.linear import Linear, can_pack
from surge.engine.llm_engine import LLMEngine
from surge.engine.runner import ModelRunner
from surge.engine.sampling import SamplingParams
from surge.model.manifest import read_manifest
from tests.engine.reference import assert_same_tokens, hf_greedy

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)


@needs_onednn
def test_rows_pick_the_kernel_and_results_agree() -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64), torch.randn(96)
    lin = Linear.of(weight, bias, pack=True)
    assert lin.packed is not None
    one, many = torch.randn(1, 1, 64), torch.randn(3, 5, 64)
    # One row reads the plain view (bit for bit F.linear); more rows go through oneDNN.
    assert torch.equal(lin(one), F.linear(one, weight, bias))
    packed_out = torch.ops.mkldnn._linear_pointwise(many, lin.packed, bias, "none", [], "")
    assert torch.equal(lin(many), packed_out)
    torch.testing.assert_close(lin(many), F.linear(many, weight, bias), rtol=1e-5, atol=1e-5)
    # The block buffer is never touched: the weight is still the caller's tensor.
    assert lin.weight.data_ptr() == weight.data_ptr()


def test_unpacked_when_not_asked_or_not_float32() -> None:
    weight = torch.randn(8, 4)
    assert Linear.of(weight, pack=False).packed is None
    assert not can_pack(weight.bfloat16())
    assert Linear.of(weight.bfloat16(), pack=True).packed is None
    x = torch.randn(2, 4)
    assert torch.equal(Linear.of(weight)(x), F.linear(x, weight))


@needs_onednn
@pytest.mark.parametrize("pack", [True, False])
def test_runner_packs_every_projection_when_configured(tiny_store: Path, pack: bool) -> None:
    runner = ModelRunner(read_manifest(tiny_store), EngineConfig(pack_cpu_weights=pack))
    runner.load_blocks()
    projections = [runner.head.lm_head] + [
        getattr(layer, name)
        for layer in runner.layers.values()
        for name in ("q", "k", "v", "o", "gate", "up", "down")
    ]
    assert len(projections) == 1 + 7 * runner.arch.num_layers
    assert all((p.packed is not None) == pack for p in projections)


@needs_onednn
def test_packed_engine_matches_transformers(tiny_hf: Path, tiny_store: Path) -> None:
    """A batch of different lengths (prefill and batched decode on the packed path) gives
    transformers' greedy tokens (near-tie rule of tests/engine/reference.py)."""
    prompts = [[0, 5, 9, 200, 31, 17, 4], [0, 8], [0, 3, 44, 55, 66, 77, 88, 99, 100]]
    engine = LLMEngine.from_store(tiny_store, EngineConfig(pack_cpu_weights=True))
    assert engine.executor.runner.layers[0].q.packed is not None
    outs = engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        ref, logits = hf_greedy(tiny_hf, prompt, 12)
        assert_same_tokens(out.token_ids, ref, logits, f"packed {prompt[:3]}")
