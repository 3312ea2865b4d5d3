"""Synthetic arrivals: a Gamma renewal process with a chosen rate and CV.

In: mean rate (req/s), coefficient of variation of inter-arrival gaps, duration, seed,
and either fixed token lengths or a donor trace whose (prompt, output) pairs are
resampled. Out: a `Trace`. Gamma gaps with shape 1/CV^2 and scale CV^2/rate have the
given mean and CV (CV = 1 is Poisson); this is how FlexPipe §9 and ParaServe §8.3 make
workloads of CV 1/2/4/8 from a base rate.
"""

import numpy as np

from surge.errors import SurgeError
from surge.traces.request import Trace, make_trace


def gamma_gaps(rng: np.random.Generator, rate_rps: float, cv: float, count: int) -> np.ndarray:
    """`count` inter-arrival gaps with mean 1/rate and coefficient of variation `cv`."""
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / (rate_rps * shape), size=count)


def gamma_arrivals(rng: np.random.Generator, rate_rps: float, cv: float, duration_s: float):
    """Arrival times in [0, duration_s) of a Gamma renewal process."""
    expected = rate_rps * duration_s
    out: list[np.ndarray] = []
    t0 = 0.0
    while True:
        batch = max(16, int(expected * 1.2) + 16)
        times = t0 + np.cumsum(gamma_gaps(rng, rate_rps, cv, batch))
        out.append(times[times < duration_s])
        if times[-1] >= duration_s:
            break
        t0 = float(times[-1])
    return np.concatenate(out) if out else np.zeros(0)


def token_lengths(
    rng: np.random.Generator,
    n: int,
    donor: Trace | None,
    input_tokens: int,
    output_tokens: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of `n` generated requests: drawn (with `rng`) from a donor
    trace's requests when one is given, else the fixed lengths."""
    if donor is not None and donor.num_requests:
        pick = rng.integers(0, donor.num_requests, size=n)
        return donor.input_tokens[pick], donor.output_tokens[pick]
    return np.full(n, input_tokens, dtype=np.int64), np.full(n, output_tokens, dtype=np.int64)


MAX_GAMMA_REQUESTS = 10_000_000
"""Most requests a generated trace may hold (a few hundred MB of arrays; `rate=1e9` asked
for 5 TiB)."""


def gamma_trace(
    rate_rps: float,
    cv: float,
    duration_s: float,
    seed: int,
    input_tokens: int = 512,
    output_tokens: int = 128,
    donor: Trace | None = None,
) -> Trace:
    """A Gamma-arrival trace; token lengths fixed, or resampled from `donor` (seeded)."""
    if not rate_rps > 0:
        raise SurgeError(f"gamma rate must be > 0 req/s (got {rate_rps})")
    if not cv > 0:
        raise SurgeError(f"gamma CV must be > 0 (got {cv})")
    if not duration_s > 0:
        raise SurgeError(f"gamma duration must be > 0 s (got {duration_s})")
    if rate_rps * duration_s > MAX_GAMMA_REQUESTS:
        raise SurgeError(
            f"gamma rate x duration is {rate_rps * duration_s:.3g} requests; at most "
            f"{MAX_GAMMA_REQUESTS:,} fit in memory: lower rate= or duration="
        )
    rng = np.random.default_rng(seed)
    arrival = gamma_arrivals(rng, rate_rps, cv, duration_s)
    n = len(arrival)
    ins, outs = token_lengths(rng, n, donor, input_tokens, output_tokens)
    return make_trace(f"gamma-rate{rate_rps:g}-cv{cv:g}", arrival, ins, outs)
