"""Choosing where tensors live, and what the engine runs there: CUDA when present, CPU
otherwise (`fake`: the CPU, behind the recorded fake GPU of `surge.engine.devmem.fake`, for
tests). One code path per concern, picked by the device:
- dtype (`compute_dtype`): bfloat16 on CUDA (tensor cores; half the bytes a decode step
  streams), the store's dtype on the CPU (its bf16 matmuls are slow);
- decode steps (`decode_path`): CUDA graphs on CUDA (`surge.engine.cuda_graphs`), the
  `torch.compile`d graph on the CPU when asked (`surge.engine.compiled`), else eager;
- attention is torch's SDPA everywhere (flash on CUDA where the step has no mask: a prompt
  alone, batch-1 decode; memory-efficient under a mask); the two-part prefix path calls
  ATen's CPU flash kernel and stays CPU-only (`PagedKVCache.prepare`), as do surge's
  one-row kernel (`engine/gemv.py`) and oneDNN packing (`engine/linear.py`).
"""

from typing import Literal

import torch

from surge.errors import SurgeError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""`EngineConfig.dtype` values other than `auto`."""


def pick_device(setting: str = "auto") -> torch.device:
    """`auto` -> cuda if available else cpu; an explicit cuda request without CUDA is an error."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "fake":
        return torch.device("cpu")
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise SurgeError(f"device {setting!r} was asked for but CUDA is not available; use cpu")
    return torch.device(setting)


def compute_dtype(setting: str, device: torch.device, stored: torch.dtype) -> torch.dtype:
    """The dtype weights, activations and the KV cache have: `setting` (`EngineConfig.dtype`)
    when not `auto`; else bfloat16 on CUDA for a float32 or bfloat16 store (a float16 store
    stays float16: its range is not bf16's), the store's own on the CPU."""
    if setting != "auto":
        return DTYPES[setting]
    if device.type == "cuda" and stored in (torch.float32, torch.bfloat16):
        return torch.bfloat16
    return stored


def decode_path(
    device: torch.device, cuda_graphs: bool, compile_decode: bool
) -> Literal["cuda_graphs", "compiled", "eager"]:
    """How a whole model's pure decode step runs on `device` (see module docstring)."""
    if device.type == "cuda":
        return "cuda_graphs" if cuda_graphs else "eager"
    return "compiled" if compile_decode else "eager"
