"""FlexPipe §9.5 Fig. 13: each model's gain is read against the system the paper names for
it (AlpaServe for WHISPER-9B and OPT-66B, ServerlessLLM for LLAMA-7B and BERT-21B), and
the row's number is their mean, as the paper's 17.32% is of its four."""

import sys
from pathlib import Path

import pytest

PAPER_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
sys.path.insert(0, str(PAPER_DIR))
sys.path.insert(0, str(PAPER_DIR / "flexpipe"))

import flexpipe_figs_rows  # noqa: E402

F13 = {
    "models": {
        m: {"improvement_vs_serverlessllm": v}
        for m, v in (("llama2-7b", 0.2), ("llama3-8b", 0.3), ("llama2-13b", 0.4))
    },
    "mean_improvement": 0.3,
    "mean_improvement_vs_host": -0.1,
}


def _alpa(gain: float) -> dict:
    return {
        "improvement_vs_alpaserve": gain,
        "flexpipe_ttft_mean_s": 1.0,
        "alpaserve_ttft_mean_s": 1.0,
        "alpaserve_groups": 1,
        "alpaserve_stages": 1,
        "alpaserve_gpus_peak": 1,
        "flexpipe_gpus_peak": 1,
        "flexpipe_spread_ttft_mean_s": 1.0,
    }


def test_paper_pairs_set_the_mean() -> None:
    pairs = flexpipe_figs_rows.FIG13_PAPER
    assert sum(p[2] for p in pairs.values()) / 4 == pytest.approx(0.1732, abs=1e-4)
    alpa = {"llama3-8b": _alpa(-0.1), "opt-66b": _alpa(0.5)}
    got = flexpipe_figs_rows.fig13_row(F13, alpa)
    assert "vs AlpaServe -10.0%" in got["simulator"]
    assert "llama2-7b (LLAMA2-7B) vs ServerlessLLM +20.0%" in got["simulator"]
    assert got["simulator"].endswith(f"mean {(-0.1 + 0.2 + 0.4 + 0.5) / 4:+.1%}")
    assert got["ordering"] is False


def test_without_alpaserve_runs_every_model_is_against_serverlessllm() -> None:
    got = flexpipe_figs_rows.fig13_row(F13, None)
    assert "AlpaServe" not in got["simulator"]
    assert got["simulator"].endswith("mean +30.0%")
