"""FlexPipe §9.6's row says what its verdict rests on: the granularity of the group it
times, which §9.6 does not state. The row's cause carries the same initialisation at
FlexPipe's finest granularity and the stage counts FlexPipe's own scale-outs start at on
Fig. 13's production trace (`flexpipe_figs.init_latency`)."""

import sys
from pathlib import Path

PAPER_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
sys.path.insert(0, str(PAPER_DIR))
sys.path.insert(0, str(PAPER_DIR / "flexpipe"))

import flexpipe_figs_rows  # noqa: E402


def _init(finest_reduction: float) -> dict:
    models = {"llama2-7b": {"flexpipe": 0.43, "serverlessllm": 1.04, "reduction": 0.59}}
    return {
        "stages": 4,
        "models": models,
        "mean_reduction": 0.59,
        "counterfactual_finest": {
            "stages": 8,
            "models": models,
            "mean_reduction": finest_reduction,
        },
        "scale_out_stages_production": {"llama2-7b": {"1": 3}, "opt-66b": {"4": 6}},
    }


def test_the_cause_names_the_finest_granularity_and_the_scale_out_starts() -> None:
    cause = flexpipe_figs_rows.init_cause(_init(0.6911))
    assert "at FlexPipe's finest (8 stages) 69% (ratio 0.31, +10%)" in cause
    assert "llama2-7b 3 x 1-stage; opt-66b 6 x 4-stage" in cause
    assert "at the finest the row would hold" in cause


def test_a_finest_reduction_outside_20_percent_is_said_to_miss() -> None:
    cause = flexpipe_figs_rows.init_cause(_init(0.50))
    assert "at the finest the row would still miss" in cause


def test_an_older_json_without_the_counterfactuals_keeps_the_cause() -> None:
    old = _init(0.69)
    del old["counterfactual_finest"], old["scale_out_stages_production"]
    cause = flexpipe_figs_rows.init_cause(old)
    assert "finest" not in cause and cause.startswith("Judged on the ratio")
