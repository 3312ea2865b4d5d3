"""Arrivals driven by ServeGen per-client windows (Xiang et al., arXiv:2505.09999).

In: a `*_client_windows.csv.gz` (client_id, window_start_s, rate_rps, iat_cv, ...), a
time span, a rate scale and a seed. Out: a `Trace` whose arrivals are, per client and
600-s window, a Gamma renewal process at the window's rate and CV (ServeGen rescales
its fitted gaps to the window's rate; we draw Gamma gaps with the window's CV directly).
Token lengths come from a donor trace (resampled) or are fixed. Each request's
`model_index` is its client's rank by requests in the span (0 = the busiest client) and
`model_names` the client ids in that order, so a scenario can give each of its models
one client's arrivals (ServeGen's per-client rates, `surge.sim.scenario`).
"""

from pathlib import Path

import numpy as np

from surge.errors import SurgeError
from surge.traces.csv_columns import read_columns, to_floats
from surge.traces.gamma import gamma_arrivals, token_lengths
from surge.traces.request import Trace, make_trace

COLUMNS = ("client_id", "window_start_s", "rate_rps", "iat_cv")
WINDOW_S = 600.0


def servegen_trace(
    path: Path,
    start_s: float,
    duration_s: float,
    seed: int,
    rate_scale: float = 1.0,
    donor: Trace | None = None,
    input_tokens: int = 512,
    output_tokens: int = 128,
) -> Trace:
    """Requests of every client in [start_s, start_s + duration_s), times from 0."""
    if not duration_s > 0 or not rate_scale > 0:
        raise SurgeError("servegen duration and rate scale must be > 0")
    cols = read_columns(path, COLUMNS)
    start = np.array(to_floats(path, "window_start_s", cols["window_start_s"]))
    rate = np.array(to_floats(path, "rate_rps", cols["rate_rps"])) * rate_scale
    cv = np.array(to_floats(path, "iat_cv", cols["iat_cv"]))
    client = cols["client_id"]
    rng = np.random.default_rng(seed)
    end_s = start_s + duration_s
    chosen = np.nonzero((start + WINDOW_S > start_s) & (start < end_s) & (rate > 0))[0]
    parts: list[np.ndarray] = []
    owners: list[str] = []
    for i in chosen:  # file order is deterministic, so the rng stream is too
        w0, w1 = max(start[i], start_s), min(start[i] + WINDOW_S, end_s)
        window_cv = cv[i] if cv[i] > 0 else 1.0
        parts.append(w0 - start_s + gamma_arrivals(rng, rate[i], window_cv, w1 - w0))
        owners.extend([client[i]] * len(parts[-1]))
    arrival = np.concatenate(parts) if parts else np.zeros(0)
    ids, inverse, counts = np.unique(
        np.array(owners, dtype=str), return_inverse=True, return_counts=True
    )
    order = sorted(range(len(ids)), key=lambda j: (-counts[j], ids[j]))
    rank = np.empty(len(ids), dtype=np.int64)
    rank[order] = np.arange(len(ids))
    n = len(arrival)
    ins, outs = token_lengths(rng, n, donor, input_tokens, output_tokens)
    names = tuple(f"client-{ids[j]}" for j in order)
    return make_trace(path.name.split("_client")[0], arrival, ins, outs, rank[inverse], names)
