"""`surge plan multicast`: JSON shape, PNG, and one-line errors with exit code 2."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from surge.cli.plan import app
from surge.errors import SurgeError

RUNNER = CliRunner()


def _run(*args: str) -> dict:
    result = RUNNER.invoke(app, ["multicast", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_has_exactly_the_issue_shape() -> None:
    out = _run("--nodes", "8", "--blocks", "4", "--sources", "2")
    assert set(out) == {
        "strategy",
        "nodes",
        "blocks",
        "sources",
        "steps",
        "complete_step",
        "pipelines",
        "timeline",
    }
    assert (out["strategy"], out["nodes"], out["blocks"], out["sources"]) == ("binomial", 8, 4, 2)
    assert out["complete_step"] == len(out["steps"]) == 5
    assert all(set(t) == {"src", "dst", "block"} for step in out["steps"] for t in step)
    assert set(out["timeline"]) == {"complete_s", "first_pipeline_s", "optimal_s"}
    assert len(out["pipelines"]) == 3
    for p in out["pipelines"]:
        assert set(p) == {"step", "stages"}
        assert all(set(s) == {"node", "blocks"} and len(s["blocks"]) == 2 for s in p["stages"])
    # 100 MB blocks on 100 Gbit/s links: 8 ms per block, optimal on uniform links.
    assert out["timeline"]["complete_s"] == pytest.approx(5 * 0.008)
    assert out["timeline"]["optimal_s"] == pytest.approx(5 * 0.008)


@pytest.mark.parametrize("strategy", ["binomial", "chain", "binary-tree", "naive"])
def test_every_strategy_and_heterogeneous_bandwidths(strategy: str, tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    result = RUNNER.invoke(
        app,
        [
            "multicast",
            "--nodes",
            "6",
            "--blocks",
            "5",
            "--strategy",
            strategy,
            "--bandwidths",
            "100,25,50,100,200,100",
            "--block-mb",
            "10",
            "--png",
            str(png),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"strategy {strategy}" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "1", "--blocks", "4"], "--nodes"),
        (["--nodes", "4", "--blocks", "0"], "--blocks"),
        (["--nodes", "4", "--blocks", "2", "--sources", "4"], "--sources"),
        (["--nodes", "4", "--blocks", "2", "--strategy", "gossip"], "unknown strategy"),
        (["--nodes", "3", "--blocks", "2", "--bandwidths", "1,2"], "one per node"),
        (["--nodes", "3", "--blocks", "2", "--bandwidths", "1,x,2"], "comma-separated"),
        (["--nodes", "3", "--blocks", "2", "--bandwidth-gbps", "0"], "> 0"),
        # non-finite or huge values: a traceback (ZeroDivisionError, OverflowError) or NaN times
        (["--nodes", "3", "--blocks", "2", "--bandwidth-gbps", "inf"], "finite number > 0"),
        (["--nodes", "3", "--blocks", "2", "--bandwidths", "inf,1,1"], "finite numbers"),
        (["--nodes", "3", "--blocks", "2", "--block-mb", "inf"], "--block-mb must be > 0"),
        (["--nodes", "3", "--blocks", "2", "--block-mb", "1e20"], "at most 1e+06"),
        (["--nodes", "3", "--blocks", "2", "--overhead-us", "nan"], "--overhead-us must be"),
        (
            ["--nodes", "3", "--blocks", "2", "--bandwidth-gbps", "5", "--bandwidths", "1,1,1"],
            "not both",
        ),
    ],
)
def test_bad_arguments_raise_surge_error(args: list[str], message: str) -> None:
    result = RUNNER.invoke(app, ["multicast", *args])
    assert isinstance(result.exception, SurgeError)
    assert message in str(result.exception)


def _surge(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from surge.cli.main import main; sys.argv[0] = 'surge'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )


def test_real_command_prints_one_line_error_and_exits_2() -> None:
    try:
        import surge.cli.main  # noqa: F401
    except Exception as e:  # the entry point is owned elsewhere; skip until it imports
        pytest.skip(f"surge.cli.main does not import yet: {e}")
    bad = _surge("plan", "multicast", "--nodes", "4", "--blocks", "2", "--sources", "5")
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and bad.stderr.startswith("error: ")
    good = _surge("plan", "multicast", "--nodes", "5", "--blocks", "3", "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["complete_step"] == 3 + 3 - 1


def test_a_scale_out_past_the_planner_limit_is_one_error_line() -> None:
    try:
        import surge.cli.main  # noqa: F401
    except Exception as e:  # the entry point is owned elsewhere; skip until it imports
        pytest.skip(f"surge.cli.main does not import yet: {e}")
    started = time.monotonic()
    for blocks in ([], ["--blocks", "64"]):  # the limit comes first, with or without B
        bad = _surge("plan", "multicast", "--nodes", "100000", *blocks)
        assert bad.returncode == 2
        assert bad.stderr.strip().count("\n") == 0 and bad.stderr.startswith("error: ")
        assert "plan at most 65,536 nodes" in bad.stderr and "split the scale-out" in bad.stderr
    assert time.monotonic() - started < 60  # refused up front, not after planning
    missing = _surge("plan", "multicast", "--nodes", "8")
    assert missing.returncode == 2 and missing.stderr.startswith("error: give --blocks")


def test_a_zigzag_too_large_to_solve_soon_is_one_error_line() -> None:
    """--batches 3,000 ran the ILP for over 2 minutes with no word; 1,000 took 17 s."""
    result = RUNNER.invoke(
        app, ["zigzag", "--layers", "80", "--load-ratio", "6", "--batches", "3000"]
    )
    assert isinstance(result.exception, SurgeError)
    assert "--batches 3,000 is over 1,000" in str(result.exception)
