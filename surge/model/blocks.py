"""Block buffers to tensors: read a block file or take bytes from the network, and view
its tensors in place.

A block is one contiguous buffer (λScale §5, tensor packing); its tensors are views into
that buffer (zero copies), so a block received into a pre-allocated buffer is usable the
moment it lands. Owned by the model store; used by the engine's runner and the data plane.
"""

from pathlib import Path

import torch

from surge.errors import SurgeError
from surge.model.manifest import BlockInfo, verify_block

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a manifest dtype name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise SurgeError(f"dtype {name!r} is not supported (use {', '.join(DTYPES)})") from None


def allocate_block_buffer(info: BlockInfo) -> bytearray:
    """A pre-allocated, writable buffer for one block (receive straight into it)."""
    return bytearray(info.size_bytes)


def read_block_file(path: Path, info: BlockInfo, verify: bool = True) -> bytearray:
    """Read a block file into a fresh buffer with `readinto` (one copy: disk to buffer)."""
    path = Path(path)
    if not path.is_file():
        raise SurgeError(f"block {info.index} file {path} is missing; re-import the model")
    buf = allocate_block_buffer(info)
    with open(path, "rb") as f:
        n = f.readinto(buf)
        extra = f.read(1)
    if n != info.size_bytes or extra:
        raise SurgeError(
            f"block {info.index} ({path.name}) has the wrong size; the file is truncated or "
            f"damaged: re-import the model"
        )
    if verify:
        verify_block(info, buf)
    return buf


def block_tensors(
    info: BlockInfo, buf: bytearray | memoryview, verify: bool = False
) -> dict[str, torch.Tensor]:
    """Tensors of a block as views into `buf` (no copy). `buf` must stay alive and unchanged."""
    view = memoryview(buf).cast("B")
    if verify:
        verify_block(info, view)
    elif len(view) != info.size_bytes:
        raise SurgeError(
            f"block {info.index}: buffer has {len(view)} bytes, expected {info.size_bytes}"
        )
    if view.readonly:
        raise SurgeError(f"block {info.index}: buffer is read-only; receive into a bytearray")
    data = (
        torch.frombuffer(view, dtype=torch.uint8)
        if len(view)
        else torch.empty(0, dtype=torch.uint8)
    )
    return tensors_in(info, data)


def tensors_in(info: BlockInfo, data: torch.Tensor) -> dict[str, torch.Tensor]:
    """Tensors of a block as views into `data`, its bytes as a uint8 tensor on any device
    (a host buffer, or the block's arena in device memory: `surge.engine.devmem`)."""
    if data.numel() != info.size_bytes:
        raise SurgeError(
            f"block {info.index}: {data.numel()} bytes on {data.device}, expected {info.size_bytes}"
        )
    out: dict[str, torch.Tensor] = {}
    for t in info.tensors:
        dtype = torch_dtype(t.dtype)
        if t.size_bytes == 0:
            out[t.name] = torch.empty(t.shape, dtype=dtype, device=data.device)
            continue
        flat = data[t.offset_bytes : t.offset_bytes + t.size_bytes].view(dtype)
        if t.transposed:  # stored [in, out]; the reader sees [out, in] as a strided view
            out[t.name] = flat.view(t.shape[::-1]).t()
        else:
            out[t.name] = flat.view(t.shape)
    return out
