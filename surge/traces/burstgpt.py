"""Loader of BurstGPT (Wang et al., HPMLL/BurstGPT) in its published schema.

In: a CSV with `Timestamp` (seconds from 0:00 of day 1), `Model` (e.g. ChatGPT, GPT-4),
`Request tokens`, `Response tokens` (optional: `Total tokens`, `Log Type`, and in v3
`Session ID`, `Elapsed time`). Out: a `Trace` whose `model_names` are the distinct
`Model` values (sorted) and whose arrivals start at 0. Rows with zero response tokens
(failed requests in the upstream data) are dropped.
"""

from pathlib import Path

import numpy as np

from surge.traces.csv_columns import read_columns, to_floats
from surge.traces.request import Trace, make_trace

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")


def load_burstgpt(path: Path) -> Trace:
    """The BurstGPT trace at `path`."""
    cols = read_columns(path, COLUMNS)
    t = np.array(to_floats(path, "Timestamp", cols["Timestamp"]))
    ins = np.array(to_floats(path, "Request tokens", cols["Request tokens"]))
    outs = np.array(to_floats(path, "Response tokens", cols["Response tokens"]))
    names = tuple(sorted(set(cols["Model"])))
    model_index = np.array([names.index(m) for m in cols["Model"]], dtype=np.int64)
    keep = outs > 0
    if t.size:
        t = t - t[keep].min() if keep.any() else t
    return make_trace(path.stem, t[keep], ins[keep], outs[keep], model_index[keep], names)
