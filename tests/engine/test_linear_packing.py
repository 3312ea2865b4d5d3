"""Packed CPU projections (`surge.engine.linear`): used where they should be, same results."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
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


@needs_onednn
def test_the_compiled_graphs_packed_op_is_cpp_and_gives_onednns_numbers() -> None:
    """`surge::packed_linear` (what a compiled decode graph of more than `gemv.max_rows()` rows
    calls) comes from surge's kernel library, registered in C++ (no Python per call; the
    Python op cost 2.3% of a 32-row step), and gives oneDNN's packed numbers bit for bit,
    with and without a bias, for a batch of decode rows [B, 1, in]."""
    from surge.engine import gemv

    if not gemv.load():
        pytest.skip("surge's CPU kernels are not built here (./setup.sh builds them)")
    kernels = torch._C._dispatch_dump("surge::packed_linear").splitlines()
    (kernel,) = [line for line in kernels if line.startswith("CompositeExplicitAutograd")]
    assert "packed_linear.cpp" in kernel  # the C++ kernel, not a Python function
    torch.manual_seed(4)
    weight, bias, x = torch.randn(96, 64), torch.randn(96), torch.randn(12, 1, 64)
    lin = Linear.of(weight, bias, pack=True)
    assert lin.packed is not None
    for b in (bias, None):
        want = torch.ops.mkldnn._linear_pointwise(x, lin.packed, b, "none", [], "")
        assert torch.equal(torch.ops.surge.packed_linear(x, lin.packed, weight, b), want)
    fake = torch._subclasses.FakeTensorMode()
    with fake:  # the shape function a compiled graph traces with
        out = torch.ops.surge.packed_linear(
            fake.from_tensor(x), fake.from_tensor(lin.packed), fake.from_tensor(weight), None
        )
    assert out.shape == (12, 1, 96)


def test_unpacked_when_not_asked_or_not_float32() -> None:
    weight = torch.randn(8, 4)
    assert Linear.of(weight, pack=False).packed is None
    assert not can_pack(weight.bfloat16())
    assert Linear.of(weight.bfloat16(), pack=True).packed is None
    x = torch.randn(2, 4)
    assert torch.equal(Linear.of(weight)(x), F.linear(x, weight))


def _projections(runner: ModelRunner) -> list[Linear]:
    return [runner.weights.head.lm_head] + [
        getattr(layer, name)
        for layer in runner.weights.layers.values()
        for name in layer.projection_names
    ]


def _batch(seq_ids: list[int]) -> BatchMeta:
    """One new token each for fresh sequences."""
    n = len(seq_ids)
    return BatchMeta(seq_ids=tuple(seq_ids), q_lens=(1,) * n, ctx_lens=(0,) * n)


@needs_onednn
@pytest.mark.parametrize("pack", [True, False])
def test_runner_packs_gradually_and_only_on_batched_steps(tiny_store: Path, pack: bool) -> None:
    """Nothing is packed when blocks land or on one-sequence steps; from the first step of 2+
    sequences, at most `max_pack_bytes_per_step` per step, until every projection is packed."""
    manifest = read_manifest(tiny_store)
    probe = ModelRunner(manifest)
    probe.load_blocks()
    biggest = max(p.num_bytes for p in _projections(probe))
    config = EngineConfig(  # unfused: fusing's copies would share the per-step budget
        compile_decode=False,  # the steps' gradual packing (a compile thread packs all)
        pack_cpu_weights=pack,
        max_pack_bytes_per_step=biggest,
        pack_min_hidden_size=1,
        fuse_projections=False,
    )
    runner = ModelRunner(manifest, config)
    runner.load_blocks()
    assert len(_projections(runner)) == 1 + 7 * runner.arch.num_layers
    assert all(p.packed is None for p in _projections(runner))  # landing packs nothing
    h = runner.embed(torch.tensor([[1], [2]]))
    runner.run_layers(0, runner.arch.num_layers, h[:1], _batch([0]))
    assert all(p.packed is None for p in _projections(runner))  # batch 1 packs nothing

    def packed_bytes() -> int:
        return sum(p.num_bytes for p in _projections(runner) if p.packed is not None)

    steps, per_step = 0, []
    while any(p.packed is None for p in _projections(runner)) and steps < 20:
        before = packed_bytes()
        runner.run_layers(0, runner.arch.num_layers, h, _batch([1 + 2 * steps, 2 + 2 * steps]))
        per_step.append(packed_bytes() - before)
        steps += 1
    if not pack:
        assert steps == 20 and per_step == [0] * 20 and not runner.weights.pack_queue
        return
    assert all(p.packed is not None for p in _projections(runner)) and not runner.weights.pack_queue
    assert 2 <= steps <= len(_projections(runner))  # spread over steps
    assert all(0 < b <= biggest for b in per_step)  # every step some, never over the budget


@needs_onednn
def test_packed_engine_matches_transformers(tiny_hf: Path, tiny_store: Path) -> None:
    """A batch of different lengths (prefill and batched decode on the packed path) gives
    transformers' greedy tokens (near-tie rule of tests/engine/reference.py)."""
    prompts = [[0, 5, 9, 200, 31, 17, 4], [0, 8], [0, 3, 44, 55, 66, 77, 88, 99, 100]]
    config = EngineConfig(
        compile_decode=False, max_pack_bytes_per_step=1, pack_min_hidden_size=1
    )  # one per step
    engine = LLMEngine.from_store(tiny_store, config)
    outs = engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    runner = engine.executor.runner
    assert runner.weights.layers[0].qkv.packed is not None  # packed while generating ...
    assert runner.weights.pack_queue  # ... part way: steps ran on a half-packed model too
    for prompt, out in zip(prompts, outs, strict=True):
        ref, logits = hf_greedy(tiny_hf, prompt, 12)
        assert_same_tokens(out.token_ids, ref, logits, f"packed {prompt[:3]}")


def test_narrow_models_are_not_packed(tiny_store: Path) -> None:
    """Below `pack_min_hidden_size` packing is slower than the plain layout: nothing queued."""
    manifest = read_manifest(tiny_store)
    assert manifest.arch.hidden_size < EngineConfig().pack_min_hidden_size
    runner = ModelRunner(manifest)
    runner.load_blocks()
    assert not runner.weights.packs and not runner.weights.pack_queue
    wide = ModelRunner(
        manifest, EngineConfig(compile_decode=False, pack_min_hidden_size=manifest.arch.hidden_size)
    )
    wide.load_blocks()
    # the store holds q|k|v, gate|up fused
    assert wide.weights.packs and not wide.weights.fuse_queue
    assert (
        len(wide.weights.pack_queue) == 1 + 4 * manifest.arch.num_layers
    )  # q|k|v, o, gate|up, down
