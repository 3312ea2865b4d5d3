"""Loader of the generic request CSV: `arrival_s,input_tokens,output_tokens[,model]`.

In: a CSV with those header names (gzip allowed). Out: a `Trace`; the optional `model`
column names each request's model (distinct names sorted into `model_names`).
"""

from pathlib import Path

import numpy as np

from surge.errors import SurgeError
from surge.traces.csv_columns import read_columns, to_floats
from surge.traces.request import Trace, make_trace

COLUMNS = ("arrival_s", "input_tokens", "output_tokens")


def load_generic(path: Path) -> Trace:
    """The generic CSV trace at `path`."""
    cols = read_columns(path, COLUMNS, optional=("model",))
    t = np.array(to_floats(path, "arrival_s", cols["arrival_s"]))
    if t.size and (t.min() < 0 or not np.all(np.isfinite(t))):
        raise SurgeError(f"trace file {path}: arrival_s must be finite and >= 0")
    ins = np.array(to_floats(path, "input_tokens", cols["input_tokens"]))
    outs = np.array(to_floats(path, "output_tokens", cols["output_tokens"]))
    if "model" in cols:
        names = tuple(sorted(set(cols["model"])))
        index = np.array([names.index(m) for m in cols["model"]], dtype=np.int64)
        return make_trace(path.stem, t, ins, outs, index, names)
    return make_trace(path.stem, t, ins, outs)
