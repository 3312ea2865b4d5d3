"""Fused q/k/v and gate/up projections (`EngineConfig.fuse_projections`, on by default): a
version-3 store holds them fused, so a runner uses them from the first step with zero copies
(views of the block buffer), or splits them into views with fusing off; an older store's
layers are fused gradually after blocks land. Every way gives the same greedy tokens (HF's),
and the block buffers stay untouched."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.linear import Linear, fuse_linears, split_linear
from surge.engine.llm_engine import LLMEngine
from surge.engine.runner import ModelRunner
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError
from surge.model.importer import import_checkpoint
from surge.model.manifest import read_manifest
from tests.engine.reference import assert_same_tokens, hf_greedy


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
        # One row goes through surge's kernel, which sums in another order than MKL.
        torch.testing.assert_close(fused(x), separate, rtol=1e-5, atol=1e-5)
    # HF's layout ([out, in] contiguous) stays that layout.
    plain = fuse_linears([Linear.of(torch.randn(8, 64)), Linear.of(torch.randn(4, 64))])
    assert plain.weight.is_contiguous() and plain.bias is None
    # split_linear is the reverse, as views of the fused weight and bias (no copy).
    back = split_linear(fused, (32, 16, 8))
    offsets = [0, 32, 48]
    for part, got, col in zip(parts, back, offsets, strict=True):
        assert torch.equal(got.weight, part.weight) and got.weight.stride() == (1, 56)
        assert got.weight.data_ptr() == fused.weight.data_ptr() + col * 4
        assert got.bias is not None and got.bias.data_ptr() == fused.bias.data_ptr() + col * 4
        x = torch.randn(3, 64)
        torch.testing.assert_close(got(x), F.linear(x, part.weight, part.bias))


def test_fuse_projections_is_validated() -> None:
    with pytest.raises(SurgeError, match="fuse_projections"):
        EngineConfig(fuse_projections="yes").validate()  # type: ignore[arg-type]


def _fused_layers(runner: ModelRunner) -> set[bool]:
    """Per layer: fused (qkv and gate_up set, the separate ones None) or unfused (reverse)."""
    kinds = set()
    for w in runner.weights.layers.values():
        fused = w.qkv is not None and w.gate_up is not None
        separate = all(getattr(w, n) is not None for n in ("q", "k", "v", "gate", "up"))
        assert fused != separate, "a layer is half fused"
        kinds.add(fused)
    return kinds


def _spans(runner: ModelRunner) -> list[tuple[int, int]]:
    """Address ranges of the runner's block buffers."""
    buffers = [
        torch.frombuffer(buf, dtype=torch.uint8) for buf in runner.weights.block_buffers.values()
    ]
    return [(b.data_ptr(), b.data_ptr() + b.numel()) for b in buffers]


def _in_buffers(t: torch.Tensor, spans: list[tuple[int, int]]) -> bool:
    return any(lo <= t.data_ptr() < hi for lo, hi in spans)


@pytest.fixture(params=["tiny_hf", "qwen2_hf"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A Llama, and a Qwen2 (q/k/v biases): the checkpoint, its store (q|k|v and gate|up
    fused) and an older-format store of it (separate tensors), each cut into 2 blocks."""
    hf_dir = request.getfixturevalue(request.param)
    import_checkpoint(hf_dir, tmp_path / "new", 2, progress=False)
    import_checkpoint(hf_dir, tmp_path / "old", 2, progress=False, fuse_projections=False)
    return hf_dir, tmp_path / "new", tmp_path / "old"


def test_stored_fused_is_used_with_zero_copies(stores: tuple[Path, Path, Path]) -> None:
    """A fresh runner on a fused store: nothing queued for fusing, every layer fused before
    its first step, qkv and gate_up (weights and biases) views of the block buffer; with
    fusing off, q/k/v/gate/up are views of those same bytes (column slices, no copy)."""
    _, new, _ = stores
    manifest = read_manifest(new)
    for fuse in (True, False):
        runner = ModelRunner(manifest, EngineConfig(compile_decode=False, fuse_projections=fuse))
        runner.load_blocks()
        assert not runner.weights.fuse_queue and _fused_layers(runner) == {fuse}
        spans = _spans(runner)
        for w in runner.weights.layers.values():
            lins = [getattr(w, n) for n in w.projection_names]
            assert len(lins) == (4 if fuse else 7)
            assert all(_in_buffers(lin.weight, spans) for lin in lins)
            assert all(_in_buffers(lin.bias, spans) for lin in lins if lin.bias is not None)
            if not fuse:  # q's columns start the stored qkv matrix, k's follow them
                q = w.q.weight
                assert w.k.weight.data_ptr() - q.data_ptr() == q.shape[0] * q.element_size()
        meta = BatchMeta(seq_ids=(0,), q_lens=(3,), ctx_lens=(0,))
        runner.forward(torch.tensor([[0, 5, 9]]), meta)
        assert not runner.weights.fuse_queue and _fused_layers(runner) == {fuse}


def test_every_layout_and_setting_gives_the_reference_tokens(
    stores: tuple[Path, Path, Path],
) -> None:
    """Fused store (fusing on: default; off: split views) and an older store (fused at run
    time; unfused): greedy tokens equal for a ragged batch (prefill and batched decode,
    packed projections included) and a lone request (batch-1 decode), and equal
    transformers'; the logits agree closely."""
    hf_dir, new, old = stores
    assert EngineConfig().fuse_projections
    base = {"pack_min_hidden_size": 1, "page_size_tokens": 4}
    prompts = [[0, 5, 9, 200, 31, 17, 4], [0, 8], [0, 3, 44, 55, 66, 77, 88, 99, 100]]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    cases = [(new, True), (new, False), (old, True), (old, False)]
    out, runners = [], []
    for store, fuse in cases:
        engine = LLMEngine(
            read_manifest(store), EngineConfig(compile_decode=False, fuse_projections=fuse, **base)
        )
        batch = engine.generate(prompts, params)
        lone = engine.generate([prompts[0]], params)
        out.append([c.token_ids for c in batch + lone])
        runners.append(engine.executor.runner)
    assert all(o == out[0] for o in out[1:])
    ref, ref_logits = hf_greedy(hf_dir, prompts[0], 16)
    assert_same_tokens(out[0][-1], ref, ref_logits, f"{hf_dir.name} fused store")
    assert [_fused_layers(r) for r in runners] == [{True}, {False}, {True}, {False}]
    assert not any(r.weights.fuse_queue for r in runners)
    fused, split, runtime_fused, _ = runners
    assert fused.weights.layers[0].qkv.packed is not None  # the batched steps used the packed copy
    assert split.weights.layers[0].q.packed is not None  # a packed copy of a view: fine
    spans = _spans(runtime_fused)  # an older store's fused weights are copies
    assert not _in_buffers(runtime_fused.weights.layers[0].qkv.weight, spans)
    # The logits agree closely too (one step of a fresh sequence through each).
    tokens = torch.tensor([prompts[2]])
    logits = []
    for runner in runners:
        meta = BatchMeta(seq_ids=(99,), q_lens=(tokens.shape[1],), ctx_lens=(0,))
        logits.append(runner.forward(tokens, meta))
        runner.free(99)
    for other in logits[1:]:
        torch.testing.assert_close(other, logits[0], rtol=1e-5, atol=1e-5)


def test_older_store_fused_gradually_in_a_layer_range_and_block_buffers_untouched(
    tiny_hf: Path, tmp_path: Path
) -> None:
    """An older store (separate q/k/v, gate/up), in a runner of a layer range (a pipeline
    stage): blocks land unfused (no copy before a layer is usable); each step fuses at most
    `max_pack_bytes_per_step` (at least one layer) until every layer is fused; the block
    buffers (forwarded to peers byte for byte) are not modified; fused weights are copies,
    the rest views of the buffers."""
    store = tmp_path / "old"
    import_checkpoint(tiny_hf, store, 3, progress=False, fuse_projections=False)
    manifest = read_manifest(store)
    end = manifest.arch.num_layers
    runner = ModelRunner(
        manifest,
        EngineConfig(compile_decode=False, max_pack_bytes_per_step=1),
        layer_range=(1, end),
    )
    runner.load_blocks()
    before = {i: bytes(buf) for i, buf in runner.weights.block_buffers.items()}
    held = sorted(runner.weights.layers)  # the range's layers (and any other its blocks hold)
    assert set(held) >= set(range(1, end)) and _fused_layers(runner) == {False}
    assert list(runner.weights.fuse_queue) == held
    hidden = torch.randn(1, 1, manifest.arch.hidden_size)
    steps = []
    for step in range(len(held) + 2):
        meta = BatchMeta(seq_ids=(0,), ctx_lens=(step,), q_lens=(1,))
        runner.run_layers(1, end, hidden, meta)  # one-sequence steps fuse too
        steps.append(sum(w.is_fused for w in runner.weights.layers.values()))
    assert steps == [min(s + 1, len(held)) for s in range(len(held) + 2)]  # a layer a step
    assert _fused_layers(runner) == {True} and not runner.weights.fuse_queue
    w = runner.weights.layers[1]
    assert w.qkv is not None and w.gate_up is not None
    spans = _spans(runner)
    assert _in_buffers(w.o.weight, spans)  # o: a view
    assert not _in_buffers(w.qkv.weight, spans)  # qkv: a copy
    assert {i: bytes(buf) for i, buf in runner.weights.block_buffers.items()} == before
