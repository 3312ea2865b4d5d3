"""Import -> load round trips, block layout, checksums and bad inputs of the model store."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from surge.errors import SurgeError
from surge.model.arch import EMBED_NAME, LM_HEAD_NAME, ModelArch, layer_prefix
from surge.model.blocks import block_tensors, read_block_file
from surge.model.importer import import_checkpoint
from surge.model.layout import default_num_blocks, partition_layers
from surge.model.manifest import STORE_VERSION, block_checksum, read_manifest
from surge.model.stored_names import FUSED_PARTS, split_sizes
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import TinyModelConfig


def hf_views(arch: ModelArch, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A store's tensors (`surge.model.blocks.block_tensors`) under HF's names: fused ones
    split back into their parts (views, no copy), the others as they are."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not name.startswith("model.layers."):
            out[name] = t
            continue
        layer = int(name.split(".")[2])
        proj, _, kind = name.removeprefix(layer_prefix(layer)).rpartition(".")
        if proj not in FUSED_PARTS:
            out[name] = t
            continue
        parts = t.split(split_sizes(arch, proj), dim=0)
        for part, view in zip(FUSED_PARTS[proj], parts, strict=True):
            out[f"{layer_prefix(layer)}{part}.{kind}"] = view
    return out


def _all_hf_tensors(hf_dir: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _all_store_tensors(store: Path) -> dict[str, torch.Tensor]:
    m = read_manifest(store)
    out: dict[str, torch.Tensor] = {}
    for b in m.blocks:
        out.update(block_tensors(b, read_block_file(m.block_path(b.index), b)))
    return hf_views(m.arch, out)  # fused q|k|v, gate|up split back into HF's tensors


@pytest.mark.parametrize("num_blocks", [1, 2, 3, 4])
def test_round_trip_is_bit_exact(tiny_hf: Path, tmp_path: Path, num_blocks: int) -> None:
    import_checkpoint(tiny_hf, tmp_path / "s", num_blocks=num_blocks, progress=False)
    ref, got = _all_hf_tensors(tiny_hf), _all_store_tensors(tmp_path / "s")
    assert set(got) == set(ref)
    for name, t in ref.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape
        got_bytes = got[name].contiguous().view(torch.uint8)
        assert torch.equal(got_bytes, t.view(torch.uint8)), name


def test_projections_are_stored_fused_transposed_and_read_as_hf_views(
    tiny_hf: Path, tmp_path: Path
) -> None:
    """q|k|v and gate|up are one tensor each; projections and lm_head lie in the block as
    [in, out] (the fast one-row gemv layout) and readers still get HF's [out, in] values
    (q, k, v as column views of the stored qkv); norms and embeddings stay as they are."""
    m = import_checkpoint(tiny_hf, tmp_path / "s", num_blocks=2, progress=False)
    ref = _all_hf_tensors(tiny_hf)
    by_name = {t.name: (b, t) for b in m.blocks for t in b.tensors}
    p = "model.layers.0."
    assert {p + "self_attn.qkv_proj.weight", p + "mlp.gate_up_proj.weight"} <= set(by_name)
    assert not [n for n in by_name if n.endswith(("q_proj.weight", "gate_proj.weight"))]
    transposed = {n for n, (_, t) in by_name.items() if t.transposed}
    assert transposed == {n for n in by_name if n.endswith("_proj.weight")} | {LM_HEAD_NAME}
    qkv = p + "self_attn.qkv_proj.weight"
    b, info = by_name[qkv]
    raw = read_block_file(m.block_path(b.index), b)
    stored = torch.frombuffer(
        raw, dtype=torch.float32, count=info.size_bytes // 4, offset=info.offset_bytes
    )
    parts = [ref[f"{p}self_attn.{x}_proj.weight"] for x in "qkv"]
    assert info.shape == (sum(t.shape[0] for t in parts), parts[0].shape[1])
    # The bytes really are [in, q_out + k_out + v_out]: each part's columns side by side.
    assert torch.equal(stored.view(info.shape[::-1]), torch.cat(parts).t())
    views = hf_views(m.arch, block_tensors(b, raw))
    q = views[p + "self_attn.q_proj.weight"]
    assert q.shape == parts[0].shape and q.stride() == (1, info.shape[0])
    assert torch.equal(q, parts[0]) and q.data_ptr() == stored.data_ptr()


def test_fused_and_separate_layouts_hold_the_same_bytes(tiny_hf: Path, tmp_path: Path) -> None:
    """A store with q|k|v and gate|up fused holds the bytes of the separate layout (the
    version-2 one, still written for tests) and no more: each block's size is its tensors
    plus alignment, and the same layers land in the same blocks (the planner, multicast and
    simulator read these sizes)."""
    new = import_checkpoint(tiny_hf, tmp_path / "new", num_blocks=3, progress=False)
    old = import_checkpoint(
        tiny_hf, tmp_path / "old", num_blocks=3, progress=False, fuse_projections=False
    )
    for a, b in zip(new.blocks, old.blocks, strict=True):
        assert (a.first_layer, a.end_layer) == (b.first_layer, b.end_layer)
        assert sum(t.size_bytes for t in a.tensors) == sum(t.size_bytes for t in b.tensors)
        assert a.size_bytes <= b.size_bytes  # fewer tensors: less alignment padding
        assert a.size_bytes == max(t.offset_bytes + t.size_bytes for t in a.tensors)
    assert len(new.blocks[1].tensors) < len(old.blocks[1].tensors)
    ref = _all_store_tensors(tmp_path / "old")
    got = _all_store_tensors(tmp_path / "new")
    assert set(got) == set(ref) and all(torch.equal(got[n], t) for n, t in ref.items())


def test_version_1_store_without_transposed_tensors_still_reads(
    tiny_hf: Path, tmp_path: Path
) -> None:
    """A store written before transposed projections (version 1: separate, row-major q, k,
    v...) reads and runs as before."""
    old = tmp_path / "old"
    m = import_checkpoint(tiny_hf, old, num_blocks=3, progress=False, fuse_projections=False)
    ref = _all_store_tensors(old)
    d = json.loads((old / "manifest.json").read_text())
    d["version"] = 1
    for b, block in zip(d["blocks"], m.blocks, strict=True):
        raw = read_block_file(m.block_path(block.index), block)
        for t, info in zip(b["tensors"], block.tensors, strict=True):
            if t.pop("transposed", False):  # rewrite the bytes row-major, as version 1 did
                view = block_tensors(block, raw)[info.name].contiguous()
                dst = torch.frombuffer(
                    raw, dtype=torch.uint8, count=info.size_bytes, offset=info.offset_bytes
                )
                dst.copy_(view.view(-1).view(torch.uint8))
        b["checksum"] = block_checksum(raw)
        (old / block.file).write_bytes(raw)
    (old / "manifest.json").write_text(json.dumps(d))
    got = _all_store_tensors(old)
    assert set(got) == set(ref)
    assert any(n.endswith("q_proj.weight") for n in got)
    for name, t in ref.items():
        assert torch.equal(got[name], t) and got[name].is_contiguous(), name
    d["version"] = STORE_VERSION + 1
    (old / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(SurgeError, match="re-import"):
        read_manifest(old)


def test_sharded_checkpoint_and_tied_embeddings(
    qwen2_hf: Path, llama3_hf: Path, tmp_path: Path
) -> None:
    import_checkpoint(qwen2_hf, tmp_path / "q", num_blocks=3, progress=False)
    ref, got = _all_hf_tensors(qwen2_hf), _all_store_tensors(tmp_path / "q")
    for name, t in ref.items():
        assert torch.equal(got[name], t), name
    assert any(n.endswith("q_proj.bias") for n in got)

    m = import_checkpoint(llama3_hf, tmp_path / "l", num_blocks=2, progress=False)
    assert LM_HEAD_NAME not in _all_hf_tensors(llama3_hf)  # tied: transformers omits it
    got = _all_store_tensors(tmp_path / "l")
    assert torch.equal(got[LM_HEAD_NAME], got[EMBED_NAME])
    # The last block carries its own head, so the last stage needs nothing from block 0.
    assert [t.name for t in m.blocks[-1].tensors][-1] == LM_HEAD_NAME
    assert m.arch.rope.rope_type == "llama3"


def test_bfloat16_round_trip(tmp_path: Path) -> None:
    create_tiny_model(tmp_path / "hf", TinyModelConfig(dtype="bfloat16", num_layers=2))
    m = import_checkpoint(tmp_path / "hf", tmp_path / "s", num_blocks=2, progress=False)
    assert m.arch.dtype == "bfloat16"
    ref, got = _all_hf_tensors(tmp_path / "hf"), _all_store_tensors(tmp_path / "s")
    for name, t in ref.items():
        assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], t)


def test_equal_blocks_pad_every_block_to_the_largest_and_keep_every_tensor(
    tiny_hf: Path, tmp_path: Path
) -> None:
    """GPU-time emulation's real stores: each block stands for one equal emulated block."""
    plain = import_checkpoint(tiny_hf, tmp_path / "p", num_blocks=3, progress=False)
    padded = import_checkpoint(
        tiny_hf, tmp_path / "e", num_blocks=3, progress=False, equal_blocks=True
    )
    sizes = [b.size_bytes for b in plain.blocks]
    assert len(set(sizes)) > 1, "the tiny model's end blocks hold the embeddings and head"
    assert [b.size_bytes for b in padded.blocks] == [max(sizes)] * 3
    assert [b.tensors for b in padded.blocks] == [b.tensors for b in plain.blocks]
    for b in padded.blocks:
        assert (tmp_path / "e" / b.file).stat().st_size == b.size_bytes
        read_block_file(padded.block_path(b.index), b)  # its checksum covers the padding
    got, ref = _all_store_tensors(tmp_path / "e"), _all_store_tensors(tmp_path / "p")
    assert set(got) == set(ref) and all(torch.equal(got[n], ref[n]) for n in ref)


def test_manifest_describes_contiguous_aligned_blocks(tiny_store: Path) -> None:
    m = read_manifest(tiny_store)
    assert m.blocks[0].has_embed and m.blocks[-1].has_head
    assert [b.first_layer for b in m.blocks[1:]] == [b.end_layer for b in m.blocks[:-1]]
    assert m.blocks[0].first_layer == 0 and m.blocks[-1].end_layer == m.arch.num_layers
    for b in m.blocks:
        assert (tiny_store / b.file).stat().st_size == b.size_bytes
        prev_end = 0
        for t in b.tensors:
            assert t.offset_bytes % 64 == 0 and t.offset_bytes >= prev_end
            prev_end = t.offset_bytes + t.size_bytes
        assert prev_end <= b.size_bytes
    # Self-contained: config and tokenizer travel with the store.
    assert (tiny_store / "config.json").is_file() and m.tokenizer_file == "tokenizer.json"
    assert json.loads((tiny_store / "manifest.json").read_text())["format"] == "surge-store"


def test_blocks_are_balanced_by_bytes() -> None:
    # One heavy layer first (embeddings), then equal layers.
    assert partition_layers([10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 11)]
    assert partition_layers([1] * 8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    ranges = partition_layers([3, 1, 4, 1, 5, 9, 2, 6], 3)
    sizes = [sum([3, 1, 4, 1, 5, 9, 2, 6][s:e]) for s, e in ranges]
    assert max(sizes) == 14  # optimal: [3,1,4,1,5] [9] [2,6] -> 14, 9, 8
    assert default_num_blocks(4) == 4 and default_num_blocks(32) == 8


def test_block_from_network_buffer_is_zero_copy(tiny_store: Path) -> None:
    m = read_manifest(tiny_store)
    info = m.blocks[1]
    buf = bytearray((tiny_store / info.file).read_bytes())  # as received from a peer
    tensors = block_tensors(info, memoryview(buf), verify=True)
    start = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    for t in tensors.values():
        assert start <= t.data_ptr() < start + len(buf)
    name = info.tensors[0].name
    before = tensors[name].clone()
    buf[info.tensors[0].offset_bytes] ^= 0xFF  # a view sees the buffer change at once
    assert not torch.equal(tensors[name], before)
    with pytest.raises(SurgeError, match="read-only"):
        block_tensors(info, bytes(buf))


def test_corrupted_block_is_refused_naming_the_block(tiny_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "s"
    shutil.copytree(tiny_store, store)
    m = read_manifest(store)
    path = m.block_path(2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(data)
    with pytest.raises(SurgeError, match=r"block 2 \(block-0002.bin\) failed its checksum"):
        read_block_file(path, m.blocks[2])
    path.write_bytes(data[:-10])
    with pytest.raises(SurgeError, match="block 2"):
        read_block_file(path, m.blocks[2])


def test_blocks_out_of_range_and_bad_checkpoints(tiny_hf: Path, tmp_path: Path) -> None:
    for b in (0, 5, -1):
        with pytest.raises(SurgeError, match=r"--blocks .* out of range: .* 4 layers"):
            import_checkpoint(tiny_hf, tmp_path / f"s{b}", num_blocks=b, progress=False)
    with pytest.raises(SurgeError, match="not a directory"):
        import_checkpoint(tmp_path / "missing", tmp_path / "s", progress=False)
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(SurgeError, match="not a Llama-family model"):
        import_checkpoint(gpt2, tmp_path / "s", progress=False)
    # A config whose heads disagree with the weights: q|k|v would be split wrongly.
    wrong = tmp_path / "wrong"
    shutil.copytree(tiny_hf, wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    (wrong / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SurgeError, match=r"qkv_proj.weight: its parts have .* config.json"):
        import_checkpoint(wrong, tmp_path / "sw", progress=False)
    import_checkpoint(tiny_hf, tmp_path / "ok", num_blocks=2, progress=False)
    with pytest.raises(SurgeError, match="not empty"):
        import_checkpoint(tiny_hf, tmp_path / "ok", num_blocks=2, progress=False)
    import_checkpoint(tiny_hf, tmp_path / "ok", num_blocks=3, overwrite=True, progress=False)
    assert read_manifest(tmp_path / "ok").num_blocks == 3


def test_no_tokenizer_imports_with_a_warning(tiny_hf: Path, tmp_path: Path, caplog) -> None:
    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf, hf)
    (hf / "tokenizer.json").unlink()
    m = import_checkpoint(hf, tmp_path / "s", num_blocks=2, progress=False)
    assert m.tokenizer_file is None
    assert "no tokenizer.json" in caplog.text


def test_tiny_model_is_deterministic(tmp_path: Path) -> None:
    def digest(d: Path) -> dict[str, str]:
        return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}

    create_tiny_model(tmp_path / "a", TinyModelConfig(seed=7))
    create_tiny_model(tmp_path / "b", TinyModelConfig(seed=7))
    create_tiny_model(tmp_path / "c", TinyModelConfig(seed=8))
    da, db, dc = digest(tmp_path / "a"), digest(tmp_path / "b"), digest(tmp_path / "c")
    assert set(da) == {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "chat_template.jinja",
    }
    assert da == db
    assert da["model.safetensors"] != dc["model.safetensors"]


def test_generation_config_eos_ids_stop_too_and_the_template_is_copied(tmp_path: Path) -> None:
    """An instruct model's end of turn is often only in generation_config.json (Llama 3's
    <|eot_id|>); the store stops at every id there, as transformers and vLLM do."""
    hf = create_tiny_model(tmp_path / "hf", TinyModelConfig(num_layers=1))
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7, 1]}))
    m = import_checkpoint(hf, tmp_path / "s", num_blocks=1, progress=False)
    assert m.arch.eos_token_ids == (1, 7)
    assert (tmp_path / "s" / "chat_template.jinja").read_text() == (
        hf / "chat_template.jinja"
    ).read_text()
