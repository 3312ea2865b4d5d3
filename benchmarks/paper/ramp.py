"""Throughput ramps for the scaling figures (λScale Fig. 10/11/16, BlitzScale Fig. 18).

In: a `SimResult` and its trace. Out: tokens per second over time (each request's output
tokens spread evenly between its first token and its end, its prompt tokens at its first
token) and the time a ramp reaches a share of its peak, the papers' "scales N x faster".
Owned by the paper reproductions (benchmarks/paper); no simulator code.
"""

import numpy as np

from surge.sim.result import SimResult
from surge.traces.request import Trace


def token_rate(
    res: SimResult, trace: Trace, step_s: float, end_s: float, prefill: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(bin starts, tokens/s): decode tokens spread over each request's decode span, or
    (`prefill`) prompt tokens counted when the prompt's first token comes out."""
    edges = np.arange(0.0, end_s + step_s, step_s)
    rate = np.zeros(len(edges) - 1)
    served = res.first_token_s >= 0
    if prefill:
        tokens, _ = np.histogram(
            res.first_token_s[served], bins=edges, weights=trace.input_tokens[served]
        )
        return edges[:-1], tokens / step_s
    for first, done, n in zip(
        res.first_token_s[served], res.done_s[served], res.output_tokens[served], strict=True
    ):
        stop = done if done >= first else end_s
        span = max(stop - first, step_s)
        lo = max(int(np.searchsorted(edges, first, side="right")) - 1, 0)
        hi = min(int(np.searchsorted(edges, first + span, side="left")), len(rate))
        if lo >= hi:
            continue
        # each bin gets the tokens of the part of the span it overlaps
        overlap = np.minimum(edges[lo + 1 : hi + 1], first + span) - np.maximum(edges[lo:hi], first)
        rate[lo:hi] += n / span * np.clip(overlap, 0.0, None)
    return edges[:-1], rate / step_s


def time_to_share(
    times: np.ndarray,
    rate: np.ndarray,
    share: float,
    window_bins: int = 1,
    reference: float | None = None,
) -> float | None:
    """First bin start at which `rate`, averaged over `window_bins` bins (prompt tokens
    come in lumps of a whole prompt), reaches `share` of `reference` (default: its own
    peak). None: no tokens, or never reached."""
    if not len(rate) or rate.max() <= 0:
        return None
    if window_bins > 1:
        rate = smooth(rate, window_bins)
    hit = np.nonzero(rate >= share * (rate.max() if reference is None else reference))[0]
    return float(times[hit[0]]) if len(hit) else None


def smooth(rate: np.ndarray, window_bins: int) -> np.ndarray:
    """Moving average over `window_bins` bins (same length)."""
    return np.convolve(rate, np.ones(window_bins) / window_bins, mode="same")


def tokens_by(times: np.ndarray, rate: np.ndarray, t_s: float, step_s: float) -> float:
    """Tokens served before `t_s`."""
    return float(rate[times < t_s].sum() * step_s)
