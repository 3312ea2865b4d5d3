"""BlitzScale §6.1's rate rule in benchmarks/paper/blitzscale/blitzscale_setup.py: each
trace is scaled "such that the peak incoming rate can be handled by all the instances", one
definition of "handled" for every workload (HANDLED_SLO_ATTAINMENT within §3's SLO with every
instance always on), and the committed result JSON runs every workload at a handled scale,
the 70B's the largest handled on its grid.
"""

import json
import sys
from pathlib import Path

PAPER_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
sys.path[0:0] = [str(PAPER_DIR), str(PAPER_DIR / "blitzscale")]

import blitzscale_setup as ev  # noqa: E402

RESULT = PAPER_DIR.parents[1] / "benchmarks" / "results" / "paper" / "blitzscale_eval.json"


def test_largest_handled_is_the_largest_scale_meeting_the_threshold() -> None:
    t = ev.HANDLED_SLO_ATTAINMENT
    by = {
        "0.1": {"slo_attainment": 1.0},
        "0.2": {"slo_attainment": t},
        "0.3": {"slo_attainment": t - 1e-4},
    }
    assert ev.largest_handled(by) == 0.2
    assert ev.largest_handled({"1": {"slo_attainment": t - 0.1}}) is None


def test_every_workload_runs_at_a_handled_scale_the_70b_at_the_largest() -> None:
    check = json.loads(RESULT.read_text())["peak_check"]
    for name, _, _, scale, _, _ in ev.WORKLOADS:
        w = check[name]
        assert w["rate_scale"] == scale, name
        assert w["by_scale"][f"{scale:g}"]["slo_attainment"] >= ev.HANDLED_SLO_ATTAINMENT, name
    w = check["70b-azurecode"]
    assert w["largest_handled_scale"] == w["rate_scale"]
    assert set(w["by_scale"]) == {f"{x:g}" for x in ev.PEAK_GRID["70b-azurecode"]}
