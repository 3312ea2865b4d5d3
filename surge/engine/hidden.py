"""Hidden states as bytes: one frame (JSON header + raw tensor bytes) per step of a stage.

The header carries the dtype, the shape and the `BatchMeta`, so the receiving stage can run
its layers without any other context. Built on `surge.wire` frames; no pickle.
"""

import torch

from surge.engine.batch import BatchMeta
from surge.model.blocks import DTYPE_NAMES, torch_dtype
from surge.wire import FrameError, decode_frame, encode_frame

KIND = "hidden"


def hidden_to_bytes(hidden: torch.Tensor, batch: BatchMeta, **extra: object) -> bytes:
    """Serialize hidden states [B, Q, H] with their batch; `extra` goes into the header."""
    h = hidden.detach().to("cpu").contiguous()
    header = {
        "kind": KIND,
        "dtype": DTYPE_NAMES[h.dtype],
        "shape": list(h.shape),
        "batch": batch.to_json(),
        **extra,
    }
    return encode_frame(header, h.reshape(-1).view(torch.uint8).numpy())


def hidden_from_bytes(buf: bytes | bytearray | memoryview) -> tuple[torch.Tensor, BatchMeta, dict]:
    """Inverse of `hidden_to_bytes`: (hidden, batch, header). The tensor owns its memory."""
    header, payload = decode_frame(buf)
    if header.get("kind") != KIND:
        raise FrameError(f"expected a hidden-states frame, got {header.get('kind')!r}")
    dtype = torch_dtype(header["dtype"])
    shape = tuple(header["shape"])
    t = (
        torch.frombuffer(bytearray(payload), dtype=dtype)
        if len(payload)
        else torch.empty(0, dtype=dtype)
    )
    return t.view(shape), BatchMeta.from_json(header["batch"]), header
