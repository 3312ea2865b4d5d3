"""`surge model import FILE.gguf STORE`: a llama.cpp GGUF file in, a packed block store out.

What flows: the GGUF's metadata becomes a Hugging Face checkpoint's side files
(`surge.model.gguf_meta`); its tensors are dequantized one at a time by the `gguf` package
(llama.cpp's own reader, memory-mapped), renamed to HF's names, Llama's q/k rows put back
in HF's order, cast to the store's dtype and written as one safetensors shard per layer in
a temporary directory beside the store; `surge.model.importer.import_checkpoint` then packs
that directory like any HF checkpoint and the temporary one is removed. Memory holds one
tensor in fp32 and one layer in the store's dtype at a time, never the whole model; the disk
holds the model twice until the import ends. Owned by the model layer.
"""

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, ReaderTensor, dequantize
from safetensors.torch import save_file
from tqdm import tqdm

from surge.errors import SurgeError
from surge.model.blocks import torch_dtype
from surge.model.gguf_meta import GgufModel, hf_tensor_name, read_gguf_model
from surge.model.import_checks import check_gguf_dtype, is_gguf
from surge.model.importer import import_checkpoint
from surge.model.layout import validate_num_blocks
from surge.model.manifest import Manifest
from surge.model.store_dir import prepare_store_dir

log = logging.getLogger(__name__)

DEFAULT_GGUF_DTYPE = "float32"
"""The store dtype a GGUF is dequantized to by default: float32. Measured here
(`benchmarks/engine/gguf_dtype.py`, SmolLM2-135M Q4_1, same process, engines alternating): a
batch-1 decode step is 1.55x faster in fp32 (surge's one-row fp32 kernel and MKL's gemv; bf16
has neither), prefill is even, batch-8 decode is 0.80x in bf16's favour (this Xeon has
AMX-BF16). One user's answer is batch-1 decode, and fp32 is what transformers computes a GGUF
in, so greedy tokens match it exactly; `--dtype bfloat16` halves memory for larger models."""


def _open(path: Path) -> GGUFReader:
    if not path.is_file():
        raise SurgeError(f"{path} is not a file; give the path of a .gguf model file")
    if not is_gguf(path):
        raise SurgeError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    try:
        return GGUFReader(path)
    except (ValueError, OSError) as e:
        raise SurgeError(f"cannot read GGUF file {path}: {e}") from None


def _dequantizable(qtype: GGMLQuantizationType) -> bool:
    """Whether the `gguf` package dequantizes `qtype` (tried on one zero block)."""
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return True
    if qtype not in GGML_QUANT_SIZES:
        return False
    _, type_bytes = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros((1, type_bytes), dtype=np.uint8), qtype)
    except (NotImplementedError, ValueError, KeyError):
        return False
    return True


def _check_tensors(reader: GGUFReader) -> None:
    """One error naming the first tensor of a type or name surge cannot import."""
    supported: dict[GGMLQuantizationType, bool] = {}
    for t in reader.tensors:
        if hf_tensor_name(t.name) is None:
            raise SurgeError(
                f"GGUF tensor {t.name} is not part of a Llama/Qwen2 model surge serves; "
                "is the file's architecture what it says?"
            )
        qtype = GGMLQuantizationType(t.tensor_type)
        if qtype not in supported:
            supported[qtype] = _dequantizable(qtype)
        if not supported[qtype]:
            raise SurgeError(
                f"GGUF tensor {t.name} has quantization type {qtype.name}, which surge cannot "
                "dequantize; use a file quantized as F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0 or a "
                "K-quant"
            )


def unpermute_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (convert_hf_to_gguf `LlamaModel.permute`): each
    head's rows were stored as (pairs, 2) interleaved; HF keeps the two halves apart."""
    rows = w.shape[0]
    return (
        w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:])
        .transpose(1, 2)
        .reshape(w.shape)
    )


def tensor_as_hf(t: ReaderTensor, model: GgufModel, dtype: torch.dtype) -> tuple[str, torch.Tensor]:
    """GGUF tensor `t` as (HF name, tensor in `dtype` with HF's layout)."""
    name = hf_tensor_name(t.name)
    assert name is not None  # _check_tensors ran first
    shape = tuple(int(d) for d in reversed(t.shape))  # ggml lists dims innermost first
    x = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
    x = x.reshape(shape)
    if model.permute_qk and (".q_proj." in name or ".k_proj." in name):
        cfg = model.config
        heads = cfg["num_attention_heads"] if ".q_proj." in name else cfg["num_key_value_heads"]
        x = unpermute_rows(x, heads)
    return name, x.to(dtype).contiguous()


def _shard_of(name: str) -> str:
    """The shard file a HF tensor goes in: one per layer, one for the rest."""
    if name.startswith("model.layers."):
        return f"layer-{int(name.split('.')[2]):05d}.safetensors"
    return "outer.safetensors"


def write_hf_checkpoint(
    reader: GGUFReader, model: GgufModel, out_dir: Path, dtype: torch.dtype, progress: bool
) -> None:
    """The GGUF as a HF checkpoint directory (config, tokenizer, template, shards)."""
    torch_name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    files = {
        "config.json": {**model.config, "torch_dtype": torch_name},
        "generation_config.json": model.generation_config,
        "tokenizer_config.json": model.tokenizer_config,
    }
    for file, content in files.items():
        (out_dir / file).write_text(json.dumps(content, indent=1) + "\n")
    model.tokenizer.save(str(out_dir / "tokenizer.json"))
    if model.chat_template is not None:
        (out_dir / "chat_template.jinja").write_text(model.chat_template)

    bar = tqdm(
        total=sum(int(t.n_bytes) for t in reader.tensors),
        unit="B",
        unit_scale=True,
        desc="dequantize",
        disable=not progress,
    )
    by_shard: dict[str, list[ReaderTensor]] = {}
    for t in reader.tensors:
        by_shard.setdefault(_shard_of(hf_tensor_name(t.name) or ""), []).append(t)
    for shard, tensors in by_shard.items():
        out: dict[str, torch.Tensor] = {}
        for t in tensors:
            name, x = tensor_as_hf(t, model, dtype)
            out[name] = x
            bar.update(int(t.n_bytes))
        save_file(out, str(out_dir / shard))
    bar.close()


def import_gguf(
    gguf_file: Path,
    store_dir: Path,
    num_blocks: int | None = None,
    name: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    dtype: str = DEFAULT_GGUF_DTYPE,
    equal_blocks: bool = False,
) -> Manifest:
    """Import GGUF file `gguf_file` into a block store at `store_dir` (weights in `dtype`;
    `equal_blocks`: as `importer.import_checkpoint`'s)."""
    gguf_file, store_dir = Path(gguf_file), Path(store_dir)
    check_gguf_dtype(dtype)
    reader = _open(gguf_file)
    model = read_gguf_model(reader)
    if num_blocks is not None:  # before minutes of dequantizing, not after
        validate_num_blocks(num_blocks, int(model.config["num_hidden_layers"]))
    _check_tensors(reader)
    # The store directory's rules (never delete what the user owns; the GGUF may not sit in
    # it) before minutes of dequantizing; it is then an empty store directory surge made.
    prepare_store_dir(gguf_file, store_dir, overwrite)
    # Beside the store: same file system, and removed whatever happens.
    with tempfile.TemporaryDirectory(dir=store_dir.parent, prefix=".surge-gguf-") as tmp:
        write_hf_checkpoint(reader, model, Path(tmp), torch_dtype(dtype), progress)
        return import_checkpoint(
            Path(tmp),
            store_dir,
            num_blocks=num_blocks,
            name=name or gguf_file.name.removesuffix(".gguf"),
            overwrite=True,  # only the marker prepare_store_dir wrote is there
            progress=progress,
            equal_blocks=equal_blocks,
        )
