"""Fused q/k/v and gate/up projections (`EngineConfig.fuse_projections`, on by default):
really on, fused gradually after blocks land, the unfused path's greedy tokens, and the block
buffers untouched."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.linear import Linear, fuse_linears
from surge.engine.llm_engine import LLMEngine
from surge.engine.runner import ModelRunner
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError
from surge.model.importer import import_checkpoint
from surge.model.manifest import read_manifest


def test_fuse_linears_concatenates_outputs_and_keeps_the_layout() -> None:
    torch.manual_seed(0)
    # Stored transposed ([in, out] contiguous, seen as [out, in]), as the block store does.
    parts = [
        Linear.of(torch.randn(64, n).t(), None if n == 16 else torch.randn(n)) for n in (32, 16, 8)
    ]
    fused = fuse_linears(parts)
    assert fused.weight.shape == (56, 64) and fused.weight.t().is_contiguous()
    assert fused.bias is not None and torch.equal(fused.bias[32:48], torch.zeros(16))
    for x in (torch.randn(1, 1, 64), torch.randn(3, 5, 64)):
        separate = torch.cat([F.linear(x, p.weight, p.bias) for p in parts], dim=-1)
        torch.testing.assert_close(fused(x), separate, rtol=1e-6, atol=1e-6)
    # HF's layout ([out, in] contiguous) stays that layout.
    plain = fuse_linears([Linear.of(torch.randn(8, 64)), Linear.of(torch.randn(4, 64))])
    assert plain.weight.is_contiguous() and plain.bias is None


def test_fuse_projections_is_validated() -> None:
    with pytest.raises(SurgeError, match="fuse_projections"):
        EngineConfig(fuse_projections="yes").validate()  # type: ignore[arg-type]


def _fused_layers(runner: ModelRunner) -> set[bool]:
    """Per layer: fused (qkv and gate_up set, the separate ones None) or unfused (reverse)."""
    kinds = set()
    for w in runner.layers.values():
        fused = w.qkv is not None and w.gate_up is not None
        separate = all(getattr(w, n) is not None for n in ("q", "k", "v", "gate", "up"))
        assert fused != separate, "a layer is half fused"
        kinds.add(fused)
    return kinds


@pytest.fixture(params=["tiny_hf", "qwen2_hf"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A Llama, and a Qwen2 (q/k/v biases), each cut into 2 blocks."""
    import_checkpoint(request.getfixturevalue(request.param), tmp_path / "s", 2, progress=False)
    return tmp_path / "s"


def test_fused_engine_gives_the_unfused_tokens(store: Path) -> None:
    """Default on; greedy tokens equal the unfused path's for a ragged batch (prefill and
    batched decode, packed projections included) and a lone request (batch-1 decode)."""
    assert EngineConfig().fuse_projections
    base = {"pack_min_hidden_size": 1, "page_size_tokens": 4}
    prompts = [[0, 5, 9, 200, 31, 17, 4], [0, 8], [0, 3, 44, 55, 66, 77, 88, 99, 100]]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    out, engines = {}, {}
    for fuse in (True, False):
        engine = LLMEngine(read_manifest(store), EngineConfig(fuse_projections=fuse, **base))
        batch = engine.generate(prompts, params)
        lone = engine.generate([prompts[0]], params)
        out[fuse] = [c.token_ids for c in batch + lone]
        engines[fuse] = engine
    assert out[True] == out[False]
    fused, unfused = (engines[f].executor.runner for f in (True, False))
    assert _fused_layers(fused) == {True} and _fused_layers(unfused) == {False}
    assert not unfused.fuse_queue
    assert fused.layers[0].qkv.packed is not None  # the batched steps used the packed copy
    # The logits agree closely too (one step of a fresh sequence through each).
    tokens = torch.tensor([prompts[2]])
    logits = {}
    for f, runner in ((True, fused), (False, unfused)):
        meta = BatchMeta(seq_ids=(99,), q_lens=(tokens.shape[1],), ctx_lens=(0,))
        logits[f] = runner.forward(tokens, meta)
        runner.free(99)
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-5, atol=1e-5)


def test_fused_gradually_in_a_layer_range_and_block_buffers_untouched(tiny_store: Path) -> None:
    """A runner of a layer range (a pipeline stage): blocks land unfused (no copy before a
    layer is usable); each step fuses at most `max_pack_bytes_per_step` (at least one layer)
    until every layer is fused; the block buffers (forwarded to peers byte for byte) are
    not modified; fused weights are copies, the rest views of the buffers."""
    manifest = read_manifest(tiny_store)
    end = manifest.arch.num_layers
    runner = ModelRunner(manifest, EngineConfig(max_pack_bytes_per_step=1), layer_range=(1, end))
    runner.load_blocks()
    before = {i: bytes(buf) for i, buf in runner.block_buffers.items()}
    held = sorted(runner.layers)  # the range's layers (and any other its blocks hold)
    assert set(held) >= set(range(1, end)) and _fused_layers(runner) == {False}
    assert list(runner.fuse_queue) == held
    hidden = torch.randn(1, 1, manifest.arch.hidden_size)
    steps = []
    for step in range(len(held) + 2):
        meta = BatchMeta(seq_ids=(0,), ctx_lens=(step,), q_lens=(1,))
        runner.run_layers(1, end, hidden, meta)  # one-sequence steps fuse too
        steps.append(sum(w.is_fused for w in runner.layers.values()))
    assert steps == [min(s + 1, len(held)) for s in range(len(held) + 2)]  # a layer a step
    assert _fused_layers(runner) == {True} and not runner.fuse_queue
    w = runner.layers[1]
    assert w.qkv is not None and w.gate_up is not None
    buffers = [torch.frombuffer(buf, dtype=torch.uint8) for buf in runner.block_buffers.values()]
    spans = [(b.data_ptr(), b.data_ptr() + b.numel()) for b in buffers]
    assert any(lo <= w.o.weight.data_ptr() < hi for lo, hi in spans)  # o: a view
    assert not any(lo <= w.qkv.weight.data_ptr() < hi for lo, hi in spans)  # qkv: a copy
    assert {i: bytes(buf) for i, buf in runner.block_buffers.items()} == before
