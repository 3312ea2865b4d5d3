"""BlitzScale §6.3 Fig. 18: the paper's 2.8x is scale done over scale done (BlitzScale
"gradually improving the throughput even before the scaling is done (at time 1,100)";
S-LLM's "overall scaling is lengthy (finishes at time 3,100s)"), so the row is judged on
when the 16th instance serves, not on the time to 80% of the prefill rate (which it
compared with the paper's scale-done ratio until 2026-11-29)."""

import sys
from pathlib import Path

PAPER_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
sys.path.insert(0, str(PAPER_DIR))
sys.path.insert(0, str(PAPER_DIR / "blitzscale"))

import blitzscale_figs_rows  # noqa: E402


def _f18(done: tuple[float, float], ramp: tuple[float, float]) -> dict:
    systems = {
        name: {"last_instance_up_s": d, "ramp_s": r, "loads": {"memory": 7, "ssd": 8, "net": 0}}
        for name, d, r in zip(("blitzscale", "serverlessllm"), done, ramp, strict=True)
    }
    return {"systems": systems, "ramp_ratio": ramp[1] / ramp[0], "ssd_load_at_10gbps_s": 10.8}


def test_the_papers_scale_done_holds_whatever_the_ramp() -> None:
    # done 1.1 / 3.1 s (the paper's 2.8x), but an 80% ramp of 5.5x
    got = blitzscale_figs_rows.fig18_row(_f18((1.1, 3.1), (2.0, 11.0)))
    assert got["within_20"] is True
    assert got["ordering"] is True
    assert got["cause"] is None
    assert "BlitzScale 1.10 s, S-LLM 3.10 s (2.82x)" in got["simulator"]


def test_a_ramp_like_the_papers_does_not_hide_a_late_scale_done() -> None:
    # an 80% ramp of 2.8x, but S-LLM's 16th instance serving 8.2x later
    got = blitzscale_figs_rows.fig18_row(_f18((1.38, 11.38), (2.0, 5.6)))
    assert got["within_20"] is False
    assert got["ordering"] is True
    assert "16th instance serves at 11.4 s" in got["cause"]
