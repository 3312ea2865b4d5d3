"""Trace transforms the papers apply: time slices, rate scaling, model mapping, clipping.

In: a `Trace` and parameters. Out: a new `Trace` (and, for clipping, a count). All
randomness takes a seed.
- `time_slice`: the requests in [start_s, start_s + duration_s), re-based to 0 (λScale
  §7.5 takes a 30-minute snippet).
- `scale_rate`: multiply the request rate by F by dividing arrival times by F (BurstGPT's
  and BlitzScale §6's rescaling); the trace gets shorter by F.
- `assign_models`: map requests to M models, uniformly or with Zipf popularity
  (multi-model clusters, λScale §2.3 Fig. 2/3).
- `clip_to_context`: prompt + output within a model's context (prompt first).
"""

import numpy as np

from surge.errors import SurgeError
from surge.traces.request import Trace


def time_slice(trace: Trace, start_s: float, duration_s: float | None) -> Trace:
    """Requests arriving in [start_s, start_s + duration_s), arrivals re-based to 0."""
    if start_s < 0:
        raise SurgeError(f"slice start must be >= 0 s (got {start_s})")
    if duration_s is not None and not duration_s > 0:
        raise SurgeError(f"duration must be > 0 s (got {duration_s})")
    end = np.inf if duration_s is None else start_s + duration_s
    mask = (trace.arrival_s >= start_s) & (trace.arrival_s < end)
    out = trace.take(mask)
    return Trace(
        out.name,
        out.arrival_s - start_s,
        out.input_tokens,
        out.output_tokens,
        out.model_index,
        out.model_names,
    )


def scale_rate(trace: Trace, factor: float) -> Trace:
    """The trace at `factor` times the request rate (arrival times divided by factor)."""
    if not factor > 0 or not np.isfinite(factor):
        raise SurgeError(f"rate scale must be a positive number (got {factor})")
    return Trace(
        trace.name,
        trace.arrival_s / factor,
        trace.input_tokens,
        trace.output_tokens,
        trace.model_index,
        trace.model_names,
    )


def assign_models(trace: Trace, num_models: int, seed: int, zipf_s: float = 0.0) -> Trace:
    """Each request gets one of `num_models` models: uniform (zipf_s = 0) or Zipf(s)."""
    if num_models < 1:
        raise SurgeError(f"number of models must be >= 1 (got {num_models})")
    if zipf_s < 0:
        raise SurgeError(f"Zipf exponent must be >= 0 (got {zipf_s})")
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, num_models + 1) ** zipf_s
    index = rng.choice(num_models, size=trace.num_requests, p=weights / weights.sum())
    return Trace(
        trace.name,
        trace.arrival_s,
        trace.input_tokens,
        trace.output_tokens,
        index.astype(np.int64),
        (),
    )


def clip_to_context(trace: Trace, context_tokens: int) -> tuple[Trace, int]:
    """Clip prompt then output so prompt + output <= context; returns (trace, clipped)."""
    if context_tokens < 2:
        raise SurgeError(f"context must be >= 2 tokens (got {context_tokens})")
    ins = np.minimum(trace.input_tokens, context_tokens - 1)
    outs = np.minimum(trace.output_tokens, context_tokens - ins)
    clipped = int(np.count_nonzero((ins != trace.input_tokens) | (outs != trace.output_tokens)))
    return (
        Trace(trace.name, trace.arrival_s, ins, outs, trace.model_index, trace.model_names),
        clipped,
    )
