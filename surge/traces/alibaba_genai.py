"""Loader of the Alibaba serverless GenAI request trace (GenTD26, Lin et al., SoCC'25).

In: `lora_request_trace.csv(.gz)` with `gmt_create` (datetime, shifted), `predict_status`
and `checkpoint_model_version_id` (the base model a request needs; 86 of them), and
optionally a donor trace for token lengths. Out: a `Trace` of the succeeded requests,
arrivals in seconds from the first, `model_names` the base models ranked by request
count (index 0 = the busiest), so a scenario can map its M models to the trace's M
busiest ones (`surge.sim.scenario`). The trace serves Stable Diffusion, not an LLM:
it has no token counts, so prompts and outputs are resampled from the donor (or fixed).
"""

from datetime import datetime
from pathlib import Path

import numpy as np

from surge.errors import SurgeError
from surge.traces.csv_columns import read_columns
from surge.traces.request import Trace, make_trace

COLUMNS = ("gmt_create", "checkpoint_model_version_id")
OPTIONAL = ("predict_status",)
FILE = "alibaba_genai_2026/lora_request_trace.csv.gz"
"""Where the trace sits inside the traces directory."""
EPOCH = datetime(1970, 1, 1)
"""Naive stamps are read as they are (no local time zone, no daylight-saving jumps)."""


def _seconds(path: Path, stamps: list[str]) -> np.ndarray:
    try:
        epoch = [(datetime.fromisoformat(s.strip()) - EPOCH).total_seconds() for s in stamps]
    except ValueError as e:
        raise SurgeError(f"trace file {path}: gmt_create is not a datetime ({e})") from None
    return np.array(epoch, dtype=np.float64)


def load_alibaba_genai(
    path: Path,
    seed: int = 0,
    donor: Trace | None = None,
    input_tokens: int = 512,
    output_tokens: int = 128,
) -> Trace:
    """The succeeded requests of the GenAI trace at `path` (see module docstring)."""
    cols = read_columns(path, COLUMNS, OPTIONAL)
    t = _seconds(path, cols["gmt_create"])
    keep = np.ones(len(t), dtype=bool)
    if "predict_status" in cols:
        keep = np.array([s == "SUCCEED" for s in cols["predict_status"]], dtype=bool)
    ids = np.array(cols["checkpoint_model_version_id"], dtype=object)[keep]
    t = t[keep]
    names, inverse, counts = np.unique(ids.astype(str), return_inverse=True, return_counts=True)
    order = sorted(range(len(names)), key=lambda i: (-counts[i], names[i]))
    rank = np.empty(len(names), dtype=np.int64)
    rank[order] = np.arange(len(names))
    n = len(t)
    if donor is not None and donor.num_requests:
        pick = np.random.default_rng(seed).integers(0, donor.num_requests, size=n)
        ins, outs = donor.input_tokens[pick], donor.output_tokens[pick]
    else:
        ins = np.full(n, input_tokens, dtype=np.int64)
        outs = np.full(n, output_tokens, dtype=np.int64)
    if n:
        t = t - t.min()
    return make_trace(
        "alibaba-genai", t, ins, outs, rank[inverse], tuple(str(names[i]) for i in order)
    )
