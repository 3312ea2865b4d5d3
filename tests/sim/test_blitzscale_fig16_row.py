"""BlitzScale §6.2 Fig. 16 measures host-cache use "under all three workloads" of §6.1: the
row reads §6.1's runs per workload (until 2026-11-29 a run of its own on one workload),
BlitzScale at most one copy and S-LLM more than one on average in every workload."""

import sys
from pathlib import Path

PAPER_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
sys.path.insert(0, str(PAPER_DIR))
sys.path.insert(0, str(PAPER_DIR / "blitzscale"))

import blitzscale_eval_rows  # noqa: E402


def _h(sllm_means: dict) -> dict:
    def copies(mean: float, peak: float) -> dict:
        return {"mean_copies": mean, "max_copies": peak, "copies_over_time": []}

    return {
        "workloads": {
            name: {
                "cluster": "c",
                "systems": {"blitzscale": copies(1.0, 1.0), "serverlessllm": copies(m, 2 * m)},
            }
            for name, m in sllm_means.items()
        }
    }


def test_every_workload_with_more_sllm_copies_holds() -> None:
    got = blitzscale_eval_rows.fig16_row(_h({"7b-azurecode": 19.6, "70b-azurecode": 3.0}))
    assert got["ordering"] is True
    assert "7b-azurecode 1 vs mean 19.6 (max 39); 70b-azurecode 1 vs mean 3.0" in got["simulator"]


def test_one_workload_where_sllm_caches_no_more_misses() -> None:
    got = blitzscale_eval_rows.fig16_row(_h({"7b-azurecode": 19.6, "8b-azureconv": 0.9}))
    assert got["ordering"] is False
