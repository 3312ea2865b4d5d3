"""How long the zigzag ILP (BlitzScale §5.2, Eq. 1) takes to solve with HiGHS.

The paper solves it in under 40 ms for Llama2-7B (32 layers) and about a dozen batches.
For 32 layers x 12 batches, and for 80 layers (Llama2-70B), this times `solve_zigzag`
over several load ratios (Time_l, load time of a layer over its execution time),
REPEATS times each after one warm-up solve, and records the median and worst wall
time with the ILP's and best-effort's average latencies (layer-execution units).

Writes benchmarks/results/systems/zigzag_solve.json.
Usage: python benchmarks/systems/zigzag_solve.py
"""

import json
import platform
import statistics
import time
from pathlib import Path

from surge.policy.blitzscale.zigzag import ZigzagProblem, best_effort, solve_zigzag

RESULTS = Path(__file__).resolve().parents[1] / "results" / "systems"
SHAPES = ((32, 12), (80, 12))  # (layers, batches)
LOAD_RATIOS = (0.25, 0.5, 1.0, 2.0, 6.0)
REPEATS = 20
PAPER_BOUND_MS = 40.0


def time_one(problem: ZigzagProblem) -> dict:
    """Median and worst solve time of `problem` over REPEATS solves, plus both latencies."""
    schedule = solve_zigzag(problem)  # warm-up: scipy import and HiGHS start-up
    times_ms = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        solve_zigzag(problem)
        times_ms.append((time.perf_counter() - started) * 1000.0)
    return {
        "layers": problem.num_layers,
        "batches": problem.num_batches,
        "load_ratio": problem.load_ratio,
        "solve_ms_median": statistics.median(times_ms),
        "solve_ms_max": max(times_ms),
        "zigzag_avg_latency": schedule.avg_latency,
        "best_effort_avg_latency": best_effort(problem).avg_latency,
    }


def main() -> None:
    rows = [
        time_one(ZigzagProblem(num_layers=layers, load_ratio=ratio, num_batches=batches))
        for layers, batches in SHAPES
        for ratio in LOAD_RATIOS
    ]
    llama7b = [r for r in rows if (r["layers"], r["batches"]) == (32, 12)]
    summary = {
        "paper_bound_ms": PAPER_BOUND_MS,
        "llama2_7b_worst_median_ms": max(r["solve_ms_median"] for r in llama7b),
        "llama2_7b_worst_max_ms": max(r["solve_ms_max"] for r in llama7b),
    }
    out = {
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
        "repeats": REPEATS,
        "summary": summary,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "zigzag_solve.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    for r in rows:
        print(
            f"L={r['layers']:3d} N={r['batches']:2d} Time_l={r['load_ratio']:5.2f}: "
            f"median {r['solve_ms_median']:6.1f} ms, max {r['solve_ms_max']:6.1f} ms; "
            f"avg latency ILP {r['zigzag_avg_latency']:.2f} vs best effort "
            f"{r['best_effort_avg_latency']:.2f}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
