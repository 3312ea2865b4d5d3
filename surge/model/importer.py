"""`surge model import`: a local HF safetensors checkpoint in, a packed block store out.

Reads one or several safetensors shards tensor by tensor, cuts the layers into blocks
balanced by bytes (`layout.partition_layers`), packs each block's tensors into one aligned
buffer (λScale §5, tensor packing) — q|k|v and gate|up concatenated into one tensor each
(`surge.model.stored_names`) — writes `block-NNNN.bin` files, copies config and
tokenizer files beside them and writes `manifest.json` last, so a directory with a
manifest is always a complete store.
"""

import logging
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from surge.errors import SurgeError
from surge.model.arch import (
    EMBED_NAME,
    FINAL_NORM_NAME,
    LM_HEAD_NAME,
    ModelArch,
)
from surge.model.blocks import DTYPE_NAMES
from surge.model.import_checks import checkpoint_arch
from surge.model.layout import partition_layers
from surge.model.manifest import (
    MANIFEST_NAME,
    TENSOR_ALIGNMENT_BYTES,
    BlockInfo,
    Manifest,
    TensorInfo,
    block_checksum,
)
from surge.model.store_dir import prepare_store_dir
from surge.model.stored_names import check_fused_rows, stored_layer_sources

log = logging.getLogger(__name__)

SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
"""Files copied from the checkpoint into the store so the store is self-contained."""


def _open_safetensors(path: Path):
    """A safetensors handle, or one `SurgeError` for a damaged or truncated file."""
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # SafetensorError (a header that does not match the file), OSError
        raise SurgeError(
            f"{path} is not a readable safetensors file ({str(e).splitlines()[0][:200]}); is "
            f"it complete? Download or save it again"
        ) from None


class _Checkpoint:
    """Lazy access to the tensors of a (possibly sharded) safetensors checkpoint."""

    def __init__(self, hf_dir: Path) -> None:
        files = sorted(hf_dir.glob("*.safetensors"))
        if not files:
            raise SurgeError(
                f"{hf_dir} has no .safetensors files; surge imports safetensors checkpoints "
                f"(re-save the model with safe_serialization=True)"
            )
        self._handles = [_open_safetensors(f) for f in files]
        self._where: dict[str, int] = {}
        for i, h in enumerate(self._handles):
            for name in h.keys():  # noqa: SIM118 - safe_open handles are not dicts
                self._where[name] = i

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, names: tuple[str, ...]) -> torch.Tensor:
        """Tensor `names[0]`, or `names`' tensors concatenated along dim 0 (a fused one)."""
        parts = [self._handles[self._where[n]].get_tensor(n) for n in names]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)

    def meta(self, names: tuple[str, ...]) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of `get(names)` without reading the data."""
        shapes, dtypes = [], set()
        for name in names:
            t = self._handles[self._where[name]].get_slice(name)
            shapes.append(tuple(t.get_shape()))
            dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}.get(
                t.get_dtype()
            )
            if dtype is None:
                raise SurgeError(
                    f"tensor {name} has dtype {t.get_dtype()}, which surge does not load"
                )
            dtypes.add(dtype)
        if len(dtypes) > 1 or len({s[1:] for s in shapes}) > 1:
            raise SurgeError(
                f"tensors {', '.join(names)} differ in dtype or width, so they cannot be "
                "stored as one; is the checkpoint consistent?"
            )
        return (sum(s[0] for s in shapes), *shapes[0][1:]), dtypes.pop()


def _align(n: int) -> int:
    return (n + TENSOR_ALIGNMENT_BYTES - 1) // TENSOR_ALIGNMENT_BYTES * TENSOR_ALIGNMENT_BYTES


def _block_sources(
    arch: ModelArch, first: int, end: int, has_embed: bool, has_head: bool, fuse: bool
) -> dict[str, tuple[str, ...]]:
    """Stored tensor name -> the HF tensors it is made of, in packing order (lm_head: as
    named; `import_checkpoint` substitutes the embeddings for a tied head)."""
    sources = {EMBED_NAME: (EMBED_NAME,)} if has_embed else {}
    for layer in range(first, end):
        sources.update(stored_layer_sources(arch, layer, fuse))
    if has_head:
        sources.update({FINAL_NORM_NAME: (FINAL_NORM_NAME,), LM_HEAD_NAME: (LM_HEAD_NAME,)})
    return sources


def stores_transposed(name: str, shape: tuple[int, ...]) -> bool:
    """Whether the importer stores tensor `name` transposed ([in, out] contiguous).

    Projection weights and lm_head: decoding one sequence multiplies one row by every
    projection, and on CPU MKL's gemv streams a column-major weight (x @ W^T with W^T
    contiguous) measurably faster than HF's row-major [out, in]: on this project's 2-core
    EPYC VM, one thread, the 100 MB preset's 43 projections ran at 10-11 GB/s vs 6-9 GB/s
    (a batch-1 decode step 18 -> 14 ms). Readers see the same logical [out, in] tensor.
    Fused q|k|v and gate|up too: [in, sum of the parts' out] contiguous, each part's columns
    side by side (what `surge.engine.linear.fuse_linears` built at run time before).
    """
    return len(shape) == 2 and (name.endswith("_proj.weight") or name == LM_HEAD_NAME)


def import_checkpoint(
    hf_dir: Path,
    store_dir: Path,
    num_blocks: int | None = None,
    name: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    fuse_projections: bool = True,
    equal_blocks: bool = False,
) -> Manifest:
    """Pack the HF checkpoint in `hf_dir` into a block store at `store_dir`.

    `fuse_projections=False` writes q, k, v, gate and up as separate tensors, the layout of
    stores made before version 3 (which users still have on disk; tests check they serve).
    `equal_blocks`: every block padded (zeros after its tensors) to the largest one's bytes,
    so that each block stands for one equal block of a larger model: GPU-time emulation's
    real stores, whose end blocks (embeddings, head) would otherwise cross every link,
    including the kernel-shaped ones and a gloo group's, as 1.6 blocks (docs/emulation.md
    "Blocks")."""
    hf_dir, store_dir = Path(hf_dir), Path(store_dir)
    arch, num_blocks = checkpoint_arch(hf_dir, num_blocks)
    ckpt = _Checkpoint(hf_dir)

    # lm_head: tied models (or checkpoints that omit it) reuse the embeddings. The last block
    # gets its own copy so the node running the last stage needs nothing from the first block.
    head_source = LM_HEAD_NAME if ckpt.has(LM_HEAD_NAME) else EMBED_NAME

    def source(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(head_source if n == LM_HEAD_NAME else n for n in names)

    every = _block_sources(arch, 0, arch.num_layers, True, True, fuse_projections)
    missing = [n for names in every.values() for n in source(names) if not ckpt.has(n)]
    if missing:
        raise SurgeError(
            f"{hf_dir} lacks {len(missing)} tensors this {arch.model_type} config needs "
            f"(first: {missing[0]}); is the checkpoint complete?"
        )

    for stored, parts in every.items():
        if len(parts) > 1:
            check_fused_rows(arch, stored, [ckpt.meta((n,))[0][0] for n in parts])

    def nbytes(names: tuple[str, ...]) -> int:
        shape, dtype = ckpt.meta(source(names))
        return _align(int(torch.Size(shape).numel()) * dtype.itemsize)

    layer_bytes = [
        sum(map(nbytes, stored_layer_sources(arch, i, fuse_projections).values()))
        for i in range(arch.num_layers)
    ]
    layer_bytes[0] += nbytes((EMBED_NAME,))
    layer_bytes[-1] += nbytes((FINAL_NORM_NAME,)) + nbytes((LM_HEAD_NAME,))
    ranges = partition_layers(layer_bytes, num_blocks)
    # a block's packed bytes are its layers' (each tensor aligned, as `nbytes` counts them)
    pad_to = max(sum(layer_bytes[a:b]) for a, b in ranges) if equal_blocks else 0

    prepare_store_dir(hf_dir, store_dir, overwrite)

    blocks: list[BlockInfo] = []
    dtype_name = "float32"
    bar = tqdm(
        total=sum(layer_bytes), unit="B", unit_scale=True, desc="import", disable=not progress
    )
    for index, (first, end) in enumerate(ranges):
        has_embed, has_head = index == 0, index == len(ranges) - 1
        sources = _block_sources(arch, first, end, has_embed, has_head, fuse_projections)
        infos: list[TensorInfo] = []
        offset = 0
        for n, parts in sources.items():
            shape, dtype = ckpt.meta(source(parts))
            size = int(torch.Size(shape).numel()) * dtype.itemsize
            transposed = stores_transposed(n, tuple(shape))
            infos.append(TensorInfo(n, DTYPE_NAMES[dtype], shape, offset, size, transposed))
            offset = _align(offset + size)
            if n == EMBED_NAME:
                dtype_name = DTYPE_NAMES[dtype]
        buf = bytearray(max(offset, pad_to))
        raw = (
            torch.frombuffer(buf, dtype=torch.uint8)
            if offset
            else torch.empty(0, dtype=torch.uint8)
        )
        for info in infos:
            t = ckpt.get(source(sources[info.name]))
            t = (t.t() if info.transposed else t).contiguous()
            raw[info.offset_bytes : info.offset_bytes + info.size_bytes].copy_(
                t.reshape(-1).view(torch.uint8)
            )
            bar.update(_align(info.size_bytes))
        file = f"block-{index:04d}.bin"
        tmp = store_dir / (file + ".tmp")
        tmp.write_bytes(buf)
        tmp.rename(store_dir / file)
        blocks.append(
            BlockInfo(
                index=index,
                file=file,
                first_layer=first,
                end_layer=end,
                has_embed=has_embed,
                has_head=has_head,
                size_bytes=len(buf),
                checksum=block_checksum(buf),
                tensors=tuple(infos),
            )
        )
    bar.close()

    for side in SIDE_FILES:
        if (hf_dir / side).is_file():
            shutil.copyfile(hf_dir / side, store_dir / side)
    tokenizer_file = "tokenizer.json" if (hf_dir / "tokenizer.json").is_file() else None
    if tokenizer_file is None:
        log.warning("%s has no tokenizer.json: the store serves token ids only", hf_dir)
    arch = ModelArch.from_dict({**arch.to_dict(), "dtype": dtype_name})
    manifest = Manifest(
        name=name or hf_dir.resolve().name,
        arch=arch,
        blocks=tuple(blocks),
        tokenizer_file=tokenizer_file,
        root=store_dir,
    )
    manifest.save(store_dir)
    assert (store_dir / MANIFEST_NAME).is_file()
    return manifest
