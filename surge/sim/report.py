"""Reports of a comparison: the JSON document and the PNG figure.

In: per-system `SimResult`s and their summaries. Out: `comparison_json` (the
`{"systems": {...}, "wall_s"}` document `surge simulate --json` writes) and
`draw_png` (GPUs allocated over time per system above the request rate, λScale Fig. 14
style, and TTFT CDFs).
"""

from pathlib import Path

from surge.sim.metrics import gpus_over_time, rate_over_time, ttft_cdf
from surge.sim.result import SimResult

JSON_KEYS = (
    "requests",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "slo_attainment",
    "gpu_seconds",
    "cache_hits",
    "cache_misses",
)
"""Keys every system's entry has (extras follow them)."""


def comparison_json(summaries: dict[str, dict], wall_s: float) -> dict:
    """The JSON document of a comparison (keys of JSON_KEYS first, then extras)."""
    systems = {}
    for name, summary in summaries.items():
        entry = {k: summary[k] for k in JSON_KEYS}
        entry.update({k: v for k, v in summary.items() if k not in JSON_KEYS and k != "wall_s"})
        systems[name] = entry
    return {"systems": systems, "wall_s": wall_s}


def draw_png(results: dict[str, SimResult], path: Path, step_s: float = 10.0) -> None:
    """GPUs over time per system above the request rate, and TTFT CDFs, into `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig = plt.figure(figsize=(12, 2.2 * (n + 1) + 3))
    grid = fig.add_gridspec(n + 2, 1, height_ratios=[1] * (n + 1) + [1.6])
    first = next(iter(results.values()))
    ax = fig.add_subplot(grid[0])
    t, rate = rate_over_time(first, step_s)
    ax.plot(t, rate, color="black", lw=1)
    ax.set_ylabel("req/s")
    ax.set_title(f"request rate ({step_s:g}-s bins)")
    for row, (name, res) in enumerate(results.items(), start=1):
        ax = fig.add_subplot(grid[row], sharex=fig.axes[0])
        times, gpus = gpus_over_time(res, 1.0)
        ax.step(times, gpus, where="post", lw=1)
        ax.set_ylabel("GPUs")
        ax.set_title(name, fontsize=9, loc="left")
    fig.axes[-1].set_xlabel("time (s)")
    ax = fig.add_subplot(grid[n + 1])
    for name, res in results.items():
        x, q = ttft_cdf(res)
        ax.plot(x, q, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
