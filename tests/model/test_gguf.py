"""GGUF import: tiny GGUF files written here (llama.cpp's layout), imported by surge, checked
against transformers reading the same file (`gguf_file=`) and against the weights written."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, dequantize
from tokenizers import Tokenizer

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError
from surge.model.blocks import block_tensors, read_block_file
from surge.model.gguf import import_gguf, unpermute_rows
from surge.model.gguf_meta import PRE_TOKENIZER_SPLITS
from surge.model.manifest import read_manifest
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import TinyModelConfig
from tests.engine.reference import assert_same_tokens, hf_greedy
from tests.model.gguf_files import CHAT_TEMPLATE, permute, write_gguf

Q = GGMLQuantizationType
PROMPT = [0, 5, 17, 250, 3, 99, 42]
TEXTS = ["Hello world! The quick brown fox, 12345.", "  two  spaces\nand a line", "é ü ☃ 日本"]

# One xdist worker runs every test here: the module's two tiny GGUF files are then written
# once, not once on each worker that draws one of its tests.
pytestmark = pytest.mark.xdist_group("gguf")


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama GGUF (GQA), matrices Q8_0, as llama.cpp's converter writes one."""
    d = tmp_path_factory.mktemp("gguf-llama")
    hf = create_tiny_model(d / "hf", TinyModelConfig(intermediate_size=352, num_layers=3))
    return write_gguf(hf, d / "tiny-llama.gguf", Q.Q8_0)


@pytest.fixture(scope="module")
def qwen2_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2 GGUF (q/k/v biases, not permuted), matrices Q4_1, tied embeddings."""
    d = tmp_path_factory.mktemp("gguf-qwen2")
    cfg = TinyModelConfig(
        intermediate_size=256, num_layers=2, model_type="qwen2", tie_word_embeddings=True, seed=3
    )
    hf = create_tiny_model(d / "hf", cfg)
    return write_gguf(hf, d / "tiny-qwen2.gguf", Q.Q4_1)


def _surge_greedy(store: Path, prompt: list[int], n: int) -> list[int]:
    engine = LLMEngine(read_manifest(store), EngineConfig())
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    (out,) = engine.generate([prompt], params)
    return out.token_ids


@pytest.mark.parametrize("which", ["llama_gguf", "qwen2_gguf"])
def test_imported_gguf_generates_as_transformers_reading_the_file(
    which: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    gguf = request.getfixturevalue(which)
    m = import_gguf(gguf, tmp_path / "store", num_blocks=2, progress=False)
    assert m.arch.model_type == ("llama" if which == "llama_gguf" else "qwen2")
    assert m.arch.dtype == "float32"
    ref, logits = hf_greedy(gguf.parent, PROMPT, 16, gguf_file=gguf.name)
    assert_same_tokens(_surge_greedy(tmp_path / "store", PROMPT, 16), ref, logits, which)


def test_weights_are_the_dequantized_tensors_in_hf_order(llama_gguf: Path, tmp_path: Path) -> None:
    """q/k rows un-permuted, every matrix exactly gguf's dequantization; bf16 is its cast."""
    reader = GGUFReader(llama_gguf)
    raw = {t.name: t for t in reader.tensors}

    def deq(name: str) -> torch.Tensor:
        t = raw[name]
        x = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        return x.reshape(tuple(int(d) for d in reversed(t.shape)))

    for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        m = import_gguf(llama_gguf, tmp_path / dtype, num_blocks=1, progress=False, dtype=dtype)
        got = block_tensors(m.blocks[0], read_block_file(m.block_path(0), m.blocks[0]))
        q = got["model.layers.1.self_attn.qkv_proj.weight"]
        want_q = unpermute_rows(deq("blk.1.attn_q.weight"), 4).to(torch_dtype)
        assert torch.equal(q[: want_q.shape[0]], want_q)
        down = got["model.layers.2.mlp.down_proj.weight"]
        assert torch.equal(down, deq("blk.2.ffn_down.weight").to(torch_dtype))
        assert got["model.embed_tokens.weight"].dtype == torch_dtype


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = torch.arange(8 * 6 * 3, dtype=torch.float32).reshape(8 * 6, 3)
    for heads in (8, 2):
        back = unpermute_rows(torch.from_numpy(permute(w.numpy(), heads)), heads)
        assert torch.equal(back, w)


def test_tokenizer_template_and_ids_come_from_the_metadata(
    llama_gguf: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    import_gguf(llama_gguf, store, progress=False)
    original = Tokenizer.from_file(str(llama_gguf.parent / "hf" / "tokenizer.json"))
    ours = Tokenizer.from_file(str(store / "tokenizer.json"))
    for text in TEXTS:
        # add_bos_token is set in the file: BOS (<s>, id 0) first, then the same pieces.
        assert ours.encode(text).ids == [0, *original.encode(text).ids]
        assert ours.decode(ours.encode(text).ids) == text
    assert ours.encode("a</s>b").ids[2] == 1, "a control token is matched whole"
    assert ours.decode([0, *original.encode("hi").ids, 1]) == "hi", "specials are skipped"
    assert (store / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    tok_cfg = json.loads((store / "tokenizer_config.json").read_text())
    assert (tok_cfg["bos_token"], tok_cfg["eos_token"], tok_cfg["add_bos_token"]) == (
        "<s>",
        "</s>",
        True,
    )
    assert json.loads((store / "generation_config.json").read_text())["eos_token_id"] == [1]
    assert read_manifest(store).arch.eos_token_ids == (1,)


def test_tokenizer_encodes_as_transformers_reading_the_file(llama_gguf: Path, tmp_path: Path):
    from transformers import AutoTokenizer

    import_gguf(llama_gguf, tmp_path / "store", progress=False)
    ours = Tokenizer.from_file(str(tmp_path / "store" / "tokenizer.json"))
    ref = AutoTokenizer.from_pretrained(llama_gguf.parent, gguf_file=llama_gguf.name)
    for text in TEXTS:
        assert ours.encode(text).ids == ref(text).input_ids, text


def test_every_known_pre_tokenizer_compiles() -> None:
    from tokenizers import Regex

    for splits in PRE_TOKENIZER_SPLITS.values():
        for s in splits:
            Regex(s)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "surge.cli", "model", "import", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def test_cli_imports_a_gguf_file(llama_gguf: Path, tmp_path: Path) -> None:
    r = _cli(str(llama_gguf), str(tmp_path / "s"), "-q", "--name", "tl", "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    assert "imported tl" in r.stdout
    assert read_manifest(tmp_path / "s").arch.dtype == "bfloat16"
    assert not list(tmp_path.glob(".surge-gguf-*")), "the temporary checkpoint is removed"


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        ({"arch": "gpt2"}, "architecture 'gpt2' is not supported"),
        ({"odd_tensor": ("blk.0.attn_q.bias", Q.I8)}, "quantization type I8"),
        ({"odd_tensor": ("blk.0.ssm_conv.weight", Q.F32)}, "blk.0.ssm_conv.weight"),
    ],
)
def test_unsupported_files_are_one_error_line(make: dict, needle: str, tmp_path: Path) -> None:
    hf = create_tiny_model(tmp_path / "hf", TinyModelConfig(num_layers=1, intermediate_size=352))
    bad = write_gguf(hf, tmp_path / "bad.gguf", **make)
    r = _cli(str(bad), str(tmp_path / "s"), "-q")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert not (tmp_path / "s").exists(), "nothing is written for a refused file"


def test_not_a_gguf_and_bad_dtype(llama_gguf: Path, tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"nope")
    with pytest.raises(SurgeError, match="not a GGUF file"):
        import_gguf(tmp_path / "x.gguf", tmp_path / "s")
    with pytest.raises(SurgeError, match="dtype 'float16'"):
        import_gguf(llama_gguf, tmp_path / "s", dtype="float16")


def test_too_many_blocks_are_refused_before_any_dequantizing(llama_gguf: Path, tmp_path: Path):
    with pytest.raises(SurgeError, match="1 <= blocks <= 3"):
        import_gguf(llama_gguf, tmp_path / "s", num_blocks=4, progress=False)
    assert not (tmp_path / "s").exists(), "refused before the store directory is made"


def test_store_dir_rules_hold_before_any_dequantizing(llama_gguf: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SurgeError, match="not empty"):
        import_gguf(llama_gguf, mine, progress=False)
    with pytest.raises(SurgeError, match="not written by `surge model import`"):
        import_gguf(llama_gguf, mine, progress=False, overwrite=True)
    assert (mine / "notes.txt").read_text() == "keep me"
    with pytest.raises(SurgeError, match="contains the checkpoint"):
        import_gguf(llama_gguf, llama_gguf.parent, progress=False, overwrite=True)
    assert llama_gguf.is_file()
    assert not list(tmp_path.glob(".surge-gguf-*"))
    import_gguf(llama_gguf, tmp_path / "s", progress=False)
    import_gguf(llama_gguf, tmp_path / "s", progress=False, overwrite=True)  # its own store
    assert read_manifest(tmp_path / "s").arch.model_type == "llama"


def test_sentencepiece_vocabulary_tokenizes_as_transformers(tmp_path: Path) -> None:
    """A Llama 2-style GGUF (tokenizer model `llama`, no merges, byte fallback)."""
    from transformers import AutoTokenizer

    hf = create_tiny_model(tmp_path / "hf", TinyModelConfig(num_layers=1, intermediate_size=352))
    gguf = write_gguf(hf, tmp_path / "spm.gguf", sentencepiece=True)
    import_gguf(gguf, tmp_path / "s", progress=False)
    ours = Tokenizer.from_file(str(tmp_path / "s" / "tokenizer.json"))
    ref = AutoTokenizer.from_pretrained(tmp_path, gguf_file="spm.gguf")
    for text in ["Hello world", "the inn in the world", "two  spaces", "é ☃ 12", " lead"]:
        ids = ours.encode(text).ids
        assert ids == ref(text).input_ids, text
        assert ids[0] == 1, "BOS: llama.cpp adds it to SentencePiece text"
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), text
