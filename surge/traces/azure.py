"""Loader of the Azure LLM inference trace 2023 (Splitwise; Patel et al., ISCA 2024).

In: `AzureLLMInferenceTrace_{code,conv}.csv` with columns TIMESTAMP (naive datetime,
7 fractional digits), ContextTokens, GeneratedTokens. Out: a `Trace` with arrivals in
seconds from the first request. The timestamps are parsed by hand (no pandas): all rows
fall on one day, so seconds = h*3600 + m*60 + s, with a day carry if the clock wraps.
"""

from pathlib import Path

import numpy as np

from surge.errors import SurgeError
from surge.traces.csv_columns import read_columns, to_floats
from surge.traces.request import Trace, make_trace

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SECONDS_PER_DAY = 86_400.0


def _clock_s(path: Path, stamp: str) -> float:
    """Seconds since midnight of 'YYYY-MM-DD HH:MM:SS.fffffff'."""
    try:
        clock = stamp.strip().split(" ")[1]
        h, m, s = clock.split(":")
        return int(h) * 3600.0 + int(m) * 60.0 + float(s)
    except (IndexError, ValueError):
        raise SurgeError(
            f"trace file {path}: TIMESTAMP {stamp!r} is not 'YYYY-MM-DD HH:MM:SS.f'"
        ) from None


def load_azure(path: Path) -> Trace:
    """The Azure 2023 trace at `path`, arrivals relative to its first request."""
    cols = read_columns(path, COLUMNS)
    clock = np.array([_clock_s(path, s) for s in cols["TIMESTAMP"]], dtype=np.float64)
    dates = cols["TIMESTAMP"]
    if clock.size:
        day = np.array([d[:10] for d in dates])
        _, day_index = np.unique(day, return_inverse=True)
        clock = clock + day_index * SECONDS_PER_DAY
        clock -= clock.min()
    ins = to_floats(path, "ContextTokens", cols["ContextTokens"])
    outs = to_floats(path, "GeneratedTokens", cols["GeneratedTokens"])
    return make_trace(path.stem, clock, np.array(ins), np.array(outs))
