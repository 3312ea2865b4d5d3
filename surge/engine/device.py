"""Choosing where tensors live: CUDA when present, CPU otherwise (`fake`: the CPU, behind the
recorded fake GPU of `surge.engine.devmem.fake`, for tests)."""

import torch

from surge.errors import SurgeError


def pick_device(setting: str = "auto") -> torch.device:
    """`auto` -> cuda if available else cpu; an explicit cuda request without CUDA is an error."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "fake":
        return torch.device("cpu")
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise SurgeError(f"device {setting!r} was asked for but CUDA is not available; use cpu")
    return torch.device(setting)
