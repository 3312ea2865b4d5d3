"""The λScale emulation benchmark's `--resume`: a run in one sitting adds its K and modes to
the JSON of another sitting's (each emulated run keeps its own code, load and D), never to a
JSON of another scenario; and both bodies' block timelines (first and last receiver per
block) are what the issue's timeline compares."""

import argparse
import json
from types import SimpleNamespace

import pytest

from benchmarks.emulation.lambdascale import SCENARIO_KEYS, earlier_runs
from benchmarks.scaleout.burst_run import block_landed
from surge.runtime.clock import Clock
from surge.runtime.multicast import MulticastResult


def _scenario(**over) -> dict:
    base = {key: 1 for key in SCENARIO_KEYS} | {"emulate": "p:m", "prompt_len": [4, 12]}
    return base | over


def test_resume_keeps_the_other_sittings_runs_and_their_dilation(tmp_path) -> None:
    path = tmp_path / "r.json"
    run = {"emulated": {"stop_the_world": {"emulation": {}}}, "simulated": {}}
    path.write_text(json.dumps(_scenario() | {"time_dilation": 80.0, "by_sources": {"4": run}}))
    args = argparse.Namespace(json=path)
    got = earlier_runs(args, _scenario())
    assert list(got) == ["4"]
    assert got["4"]["emulated"]["stop_the_world"]["emulation"]["time_dilation"] == 80.0
    assert earlier_runs(argparse.Namespace(json=tmp_path / "none.json"), _scenario()) == {}
    with pytest.raises(ValueError, match="requests"):
        earlier_runs(args, _scenario(requests=64))


def test_block_landed_is_each_blocks_first_and_last_receiver_in_clock_seconds() -> None:
    plan = SimpleNamespace(num_sources=1, num_blocks=2)
    arrivals = [[0.0, 0.0], [8.0, 16.0], [24.0, None], [None, None]]
    result = MulticastResult(plan, arrivals, [], None, None)  # type: ignore[arg-type]
    assert block_landed(result, Clock(8.0)) == [[1.0, 3.0], [2.0, 2.0]]
    assert block_landed(None, Clock(8.0)) is None
