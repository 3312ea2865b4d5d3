"""From a `SimResult` to the numbers of the comparison table and JSON.

In: a `SimResult` and the run's `SimSettings` (for per-model SLOs). Out: `summarize`'s
dict with the keys `surge simulate` writes ("requests", "ttft_p50_s", ..., "cache_hits",
"cache_misses") plus extras, `gpu_seconds` (the integral of allocated GPUs), a
GPUs-over-time step series, throughput over time, and TTFT CDF points.
Unfinished requests count as SLO misses and are left out of latency percentiles.
"""

import numpy as np

from surge.sim.result import SimResult
from surge.sim.settings import SimSettings


def ttft_s(res: SimResult) -> np.ndarray:
    """TTFT of every request that got a first token."""
    ok = res.first_token_s >= 0
    return res.first_token_s[ok] - res.arrival_s[ok]


def tpot_s(res: SimResult) -> np.ndarray:
    """Time per output token after the first, of finished requests with >= 2 tokens."""
    ok = (res.done_s >= 0) & (res.output_tokens > 1)
    return (res.done_s[ok] - res.first_token_s[ok]) / (res.output_tokens[ok] - 1)


def gpu_seconds(res: SimResult) -> float:
    """Integral of allocated GPUs over [0, end_s]."""
    total, last_t, last_n = 0.0, 0.0, 0
    for t, n in res.gpu_changes:
        total += last_n * (t - last_t)
        last_t, last_n = t, n
    return total + last_n * max(res.end_s - last_t, 0.0)


def gpus_over_time(res: SimResult, step_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(times, GPUs allocated) sampled every `step_s` from 0 to end_s."""
    times = np.arange(0.0, res.end_s + step_s, step_s)
    if not res.gpu_changes:
        return times, np.zeros(len(times))
    change_t = np.array([t for t, _ in res.gpu_changes])
    change_n = np.array([n for _, n in res.gpu_changes])
    idx = np.searchsorted(change_t, times, side="right") - 1
    return times, np.where(idx >= 0, change_n[np.maximum(idx, 0)], 0)


def rate_over_time(res: SimResult, step_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(bin starts, requests per second arriving in each bin)."""
    end = max(res.end_s, float(res.arrival_s.max()) if len(res.arrival_s) else 0.0)
    edges = np.arange(0.0, end + step_s, step_s)
    counts, _ = np.histogram(res.arrival_s, bins=edges) if len(edges) > 1 else (np.zeros(0), 0)
    return edges[:-1], counts / step_s


def throughput_over_time(res: SimResult, step_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(bin starts, output tokens per second of requests finishing in each bin)."""
    done = res.done_s >= 0
    edges = np.arange(0.0, res.end_s + step_s, step_s)
    if len(edges) < 2:
        return np.zeros(0), np.zeros(0)
    tokens, _ = np.histogram(res.done_s[done], bins=edges, weights=res.output_tokens[done])
    return edges[:-1], tokens / step_s


def slo_attainment(res: SimResult, settings: SimSettings) -> float:
    """Fraction of requests meeting their model's TTFT and TPOT SLOs."""
    if len(res.arrival_s) == 0:
        return 1.0
    return float(slo_met(res, settings).mean())


def slo_met(res: SimResult, settings: SimSettings) -> np.ndarray:
    """Per request: whether it finished within its model's TTFT and TPOT SLOs."""
    ttft_slo = np.array([settings.slo_of(m).ttft_s for m in res.model_names])[res.model_index]
    tpot_slo = np.array([settings.slo_of(m).tpot_s for m in res.model_names])[res.model_index]
    done = res.done_s >= 0
    ttft = np.where(res.first_token_s >= 0, res.first_token_s - res.arrival_s, np.inf)
    multi = res.output_tokens > 1
    tpot = np.where(
        done & multi, (res.done_s - res.first_token_s) / np.maximum(res.output_tokens - 1, 1), 0.0
    )
    return done & (ttft <= ttft_slo) & (tpot <= tpot_slo)


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def summarize(res: SimResult, settings: SimSettings) -> dict:
    """The comparison numbers of one run."""
    ttft, tpot = ttft_s(res), tpot_s(res)
    return {
        "requests": len(res.arrival_s),
        "finished": int(np.count_nonzero(res.done_s >= 0)),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "ttft_p99_s": _pct(ttft, 99),
        "ttft_mean_s": float(ttft.mean()) if len(ttft) else None,
        "tpot_p50_s": _pct(tpot, 50),
        "tpot_p90_s": _pct(tpot, 90),
        "slo_attainment": slo_attainment(res, settings),
        "gpu_seconds": gpu_seconds(res),
        "cache_hits": res.cache_hits,
        "cache_misses": res.cache_misses,
        "network_loads": res.network_loads,
        "hot_requests": res.hot_requests,
        "clipped_requests": res.clipped_requests,
        "scale_outs": sum(c for _, _, k, c in res.scale_events if k == "scale-out"),
        "mutations": sum(c for _, _, k, c in res.scale_events if k == "mutate"),
        "pipelines": sum(c for _, _, k, c in res.scale_events if k == "pipeline"),
        "consolidations": sum(1 for _, _, k, _ in res.scale_events if k == "consolidate"),
        "refactors": sum(1 for _, _, k, _ in res.scale_events if k == "refactor"),
        "max_host_cache_bytes": max((b for _, _, b in res.samples), default=0),
        "sim_end_s": res.end_s,
        "events": res.num_events,
        "wall_s": res.wall_s,
    }


def ttft_cdf(res: SimResult, points: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT values, cumulative fraction) at up to `points` quantiles."""
    ttft = np.sort(ttft_s(res))
    if not len(ttft):
        return np.zeros(0), np.zeros(0)
    q = np.linspace(0, 1, min(points, len(ttft)))
    return np.quantile(ttft, q), q
