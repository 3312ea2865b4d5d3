"""benchmarks/paper/paraserve: the deployment readings paraserve_eval.py rests on.

§8.5 deploys no node prefetcher (ParaServe's start-up follows its fetch there); the V100
of §8.4 scale-down decodes at Table 1's TPOT; §8.2's sentence on
ServerlessLLM with cached models decides which S-LLM starts the §8.3 row counts.
"""

import sys
from pathlib import Path

import pytest

PAPER_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
sys.path.insert(0, str(PAPER_DIR))
sys.path.insert(0, str(PAPER_DIR / "paraserve"))

import paraserve_brownfield  # noqa: E402
import paraserve_checks  # noqa: E402
import paraserve_rows  # noqa: E402

from surge.policy.systems import system_config  # noqa: E402


def test_brownfield_paraserve_has_no_prefetcher_overlap() -> None:
    # §8.5: "incorporating the parameter manager and engine optimizations" (no prefetcher)
    assert system_config("paraserve").init_overlaps_load is True
    assert paraserve_brownfield.brownfield_paraserve().init_overlaps_load is False
    assert paraserve_brownfield.brownfield_paraserve(prefetcher=True).init_overlaps_load is True


def test_the_v100_decodes_13b_at_table1_tpot() -> None:
    # the profile's (gpus.json), which scale-down's row reads: no counterfactual V100 left
    assert paraserve_checks.simulated_tpot_s() == pytest.approx(0.058, rel=2e-3)


def _e2e(ratios: dict[str, list[float]], headline: list[float]) -> dict:
    rows = []
    for i, h in enumerate(headline):
        sens = {k: {"paraserve_ratio": v[i]} for k, v in ratios.items()}
        rows.append(
            {
                "rate_rps": 0.3 * 2**i,
                "cv": 8.0,
                "ratio_vs_serverlessllm": h,
                "ratio_vs_best_baseline": h,
                "serverlessllm_start_sensitivity": sens,
            }
        )
    return {"rows": rows, "max_ratio_vs_best_baseline": max(headline)}


def test_fig11_cause_names_only_starts_section_8_2_rules_out() -> None:
    e2e = _e2e({"0.5s_after": [1.1, 0.9], "10.0s_beside": [2.0, 2.5]}, [1.2, 1.5])
    check = {
        "allowed_by_8_2": {"6.8s_beside": True, "0.5s_after": False, "10.0s_beside": True},
        "llama2-7b_A10": {
            "paraserve_one_worker_ttft_s": 6.9,
            "serverlessllm_cached_ttft_s": {
                "6.8s_beside": 7.0,
                "0.5s_after": 1.5,
                "10.0s_beside": 10.2,
            },
        },
    }
    ok, ruled_out = paraserve_rows.start_split(e2e, check)
    assert ok == {"6.8s_beside": 1.2, "10.0s_beside": 2.0}
    assert ruled_out == {"0.5s_after": 0.9}
    cause = paraserve_rows.start_cause(e2e, check)
    assert cause is not None and "0.5 s after: 0.90x" in cause and "rules out" in cause
    assert "(at 0.6 req/s CV 8)" in cause  # the points where it misses, read from the rows
    # a start the sentence allows that misses is not explained away
    e2e = _e2e({"0.5s_after": [1.1, 0.9], "10.0s_beside": [2.0, 0.8]}, [1.2, 1.5])
    cause = paraserve_rows.start_cause(e2e, check)
    assert cause is not None and "rests on" in cause
