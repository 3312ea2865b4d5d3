"""Pieces of `benchmarks/gpu_check.py`: the host->device link (`link.py`), the 7B-shaped
store and what runs on it (`model.py`), two agents sharing one device copy (`share.py`)."""
