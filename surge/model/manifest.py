"""The manifest of a packed model store: which blocks exist and where every tensor lies.

A store directory holds `manifest.json`, one `block-NNNN.bin` per block, and the
checkpoint's `config.json` / tokenizer files beside them, so it is self-contained. The
manifest is plain JSON read without torch, so controllers and planners can use it
cheaply. Written by `surge.model.importer`, read by everyone who moves or runs blocks.
"""

import functools
import hashlib
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from surge.errors import SurgeError, shorten
from surge.model.arch import ModelArch

MANIFEST_NAME = "manifest.json"
STORE_FORMAT = "surge-store"
STORE_VERSION = 3
"""2: projection weights may be stored transposed (`TensorInfo.transposed`). 3: q|k|v and
gate|up may be stored as one tensor each (`surge.model.stored_names`)."""
READABLE_STORE_VERSIONS = (1, 2, 3)
"""Versions this surge reads: a version-1 store simply has no transposed tensors, a version-2
store no fused ones."""
TENSOR_ALIGNMENT_BYTES = 64
"""Every tensor starts at a multiple of this offset inside its block (cache-line aligned)."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives inside its block buffer."""

    name: str
    """HF tensor name, e.g. `model.layers.3.self_attn.o_proj.weight`, or a fused one
    (`...self_attn.qkv_proj.weight`, `surge.model.stored_names`)."""
    dtype: str
    """float32, float16 or bfloat16."""
    shape: tuple[int, ...]
    offset_bytes: int
    size_bytes: int
    transposed: bool = False
    """Stored as the contiguous transpose of `shape` (a projection's [in, out]): readers get
    a transposed view with the logical `shape` (see `surge.model.blocks.block_tensors`)."""


@dataclass(frozen=True)
class BlockInfo:
    """One block: a contiguous layer range packed into one buffer (λScale §5, tensor packing)."""

    index: int
    file: str
    first_layer: int
    end_layer: int
    """One past the last layer held (layers [first_layer, end_layer))."""
    has_embed: bool
    """Holds the token embeddings (the first block)."""
    has_head: bool
    """Holds the final norm and lm_head (the last block)."""
    size_bytes: int
    checksum: str
    """`crc32:xxxxxxxx` of the whole block buffer."""
    tensors: tuple[TensorInfo, ...] = field(default=())

    @property
    def num_layers(self) -> int:
        return self.end_layer - self.first_layer


@dataclass(frozen=True)
class Manifest:
    """A packed model store's table of contents."""

    name: str
    arch: ModelArch
    blocks: tuple[BlockInfo, ...]
    tokenizer_file: str | None
    """File name of the tokenizer beside the manifest, or None (the store serves token ids)."""
    root: Path | None = None
    """Directory the manifest was read from (None for a manifest received over a wire)."""

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def total_bytes(self) -> int:
        return sum(b.size_bytes for b in self.blocks)

    def block_path(self, index: int) -> Path:
        """Path of block `index`'s file in this store."""
        if self.root is None:
            raise RuntimeError("manifest has no root directory")
        return self.root / self.blocks[index].file

    def blocks_for_layers(self, first_layer: int, end_layer: int) -> list[int]:
        """Indices of the blocks that hold layers [first_layer, end_layer)."""
        return [
            b.index for b in self.blocks if b.first_layer < end_layer and b.end_layer > first_layer
        ]

    @functools.cached_property
    def digest(self) -> str:
        """What identifies this version of the model: a SHA-256 of the manifest's JSON (its
        architecture, blocks, tensors and each block's checksum), not of where it was read
        from. Two stores with equal digests hold the same weights in the same layout."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STORE_FORMAT,
            "version": STORE_VERSION,
            "name": self.name,
            "alignment_bytes": TENSOR_ALIGNMENT_BYTES,
            "arch": self.arch.to_dict(),
            "tokenizer_file": self.tokenizer_file,
            "blocks": [
                {
                    "index": b.index,
                    "file": b.file,
                    "layers": [b.first_layer, b.end_layer],
                    "has_embed": b.has_embed,
                    "has_head": b.has_head,
                    "size_bytes": b.size_bytes,
                    "checksum": b.checksum,
                    "tensors": [
                        {
                            "name": t.name,
                            "dtype": t.dtype,
                            "shape": list(t.shape),
                            "offset_bytes": t.offset_bytes,
                            "size_bytes": t.size_bytes,
                            **({"transposed": True} if t.transposed else {}),
                        }
                        for t in b.tensors
                    ],
                }
                for b in self.blocks
            ],
        }

    @staticmethod
    def from_json(d: dict[str, Any], root: Path | None = None) -> "Manifest":
        if d.get("format") != STORE_FORMAT:
            raise SurgeError(
                "not a surge store manifest; import a checkpoint with `surge model import`"
            )
        if d.get("version") not in READABLE_STORE_VERSIONS:
            raise SurgeError(
                f"store format version {d.get('version')} is not supported (this surge reads "
                f"versions {', '.join(map(str, READABLE_STORE_VERSIONS))}); re-import the "
                "checkpoint"
            )
        blocks = tuple(
            BlockInfo(
                index=b["index"],
                file=b["file"],
                first_layer=b["layers"][0],
                end_layer=b["layers"][1],
                has_embed=b["has_embed"],
                has_head=b["has_head"],
                size_bytes=b["size_bytes"],
                checksum=b["checksum"],
                tensors=tuple(
                    TensorInfo(
                        name=t["name"],
                        dtype=t["dtype"],
                        shape=tuple(t["shape"]),
                        offset_bytes=t["offset_bytes"],
                        size_bytes=t["size_bytes"],
                        transposed=bool(t.get("transposed", False)),
                    )
                    for t in b["tensors"]
                ),
            )
            for b in d["blocks"]
        )
        for file in [b.file for b in blocks] + [d.get("tokenizer_file") or "x"]:
            if not isinstance(file, str) or Path(file).name != file or file in (".", ".."):
                raise SurgeError(
                    f"the manifest names the file {shorten(str(file))!r}, which is not a file "
                    "inside the store; the manifest is damaged: import the model again"
                )
        return Manifest(
            name=d["name"],
            arch=ModelArch.from_dict(d["arch"]),
            blocks=blocks,
            tokenizer_file=d.get("tokenizer_file"),
            root=root,
        )

    def save(self, root: Path) -> None:
        (Path(root) / MANIFEST_NAME).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def read_manifest(store_dir: Path) -> Manifest:
    """Read a store's manifest, with a clear error if `store_dir` is not a store."""
    store_dir = Path(store_dir)
    if not store_dir.is_dir():
        raise SurgeError(
            f"{store_dir} is not a directory; give a store made by `surge model import`"
        )
    path = store_dir / MANIFEST_NAME
    if not path.is_file():
        hint = (
            " (it looks like a HF checkpoint: run `surge model import` on it first)"
            if (store_dir / "config.json").is_file()
            else ""
        )
        raise SurgeError(f"{store_dir} has no {MANIFEST_NAME}{hint}")
    try:
        return Manifest.from_json(json.loads(path.read_text()), root=store_dir)
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise SurgeError(f"{path} is damaged ({e!r}); re-import the checkpoint") from None


def block_checksum(buf: bytes | bytearray | memoryview) -> str:
    """Checksum of a block buffer; crc32 runs at ~3 GB/s here, close to loopback speed."""
    return f"crc32:{zlib.crc32(buf) & 0xFFFFFFFF:08x}"


class RunningChecksum:
    """A block's crc32 taken while its bytes arrive, so the block is verified when its last
    read lands, not one whole-buffer pass later (on a slow link that pass held every
    forwarded block up by ~1.5 ms of CPU, more on a node with a fraction of a core).

    Reads are summed in order while each is at most `max_inline_bytes` (small reads: the
    link is slower than the reader, and summing one costs less than a wake-up); once a read
    is larger or out of order, the rest is summed at `finish`, off the event loop."""

    def __init__(self, max_inline_bytes: int = 1 << 20) -> None:
        self.max_inline_bytes = max_inline_bytes
        self.value = 0
        self.num_bytes = 0
        """Bytes at the start of the buffer summed so far."""

    def update(self, chunk: memoryview, offset: int) -> None:
        """`chunk` has just landed at `offset` of the buffer."""
        if offset == self.num_bytes and len(chunk) <= self.max_inline_bytes:
            self.value = zlib.crc32(chunk, self.value)
            self.num_bytes += len(chunk)

    def finish(self, buf: bytes | bytearray | memoryview) -> str:
        """The checksum of the whole of `buf` (in `block_checksum`'s form)."""
        rest = memoryview(buf).cast("B")[self.num_bytes :]
        return f"crc32:{zlib.crc32(rest, self.value) & 0xFFFFFFFF:08x}"


def verify_block(
    info: BlockInfo,
    buf: bytes | bytearray | memoryview,
    running: RunningChecksum | None = None,
) -> None:
    """Raise a `SurgeError` naming the block if `buf` does not match the manifest
    (`running`: the part of its checksum taken while it arrived)."""
    n = len(memoryview(buf).cast("B"))
    if n != info.size_bytes:
        raise SurgeError(
            f"block {info.index} ({info.file}) has {n} bytes, the manifest says "
            f"{info.size_bytes}; the block is truncated or damaged: fetch or import it again"
        )
    got = running.finish(buf) if running is not None else block_checksum(buf)
    if got != info.checksum:
        raise SurgeError(
            f"block {info.index} ({info.file}) failed its checksum ({got} != {info.checksum}); "
            f"the block is corrupted: fetch or import it again"
        )


def verify_store(manifest: Manifest, checksums: bool = True) -> None:
    """Raise a `SurgeError` naming the first bad block of `manifest`'s store: a block file
    missing, of the wrong size, or (with `checksums`) failing its checksum — the checks of
    `surge model inspect --verify`. Without `checksums` only sizes are read (a stat each)."""
    for info in manifest.blocks:
        path = manifest.block_path(info.index)
        if not path.is_file():
            raise SurgeError(
                f"store {manifest.root} is damaged: block {info.index} ({info.file}) is "
                "missing; import the model again (`surge model import`)"
            )
        size = path.stat().st_size
        if size != info.size_bytes:
            raise SurgeError(
                f"store {manifest.root} is damaged: block {info.index} ({info.file}) has "
                f"{size} bytes, the manifest says {info.size_bytes}; import the model again"
            )
        if not checksums:
            continue
        try:
            verify_block(info, path.read_bytes())
        except SurgeError as e:
            raise SurgeError(f"store {manifest.root} is damaged: {e}") from None
