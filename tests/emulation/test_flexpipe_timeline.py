"""The FlexPipe §9 timeline tool (`benchmarks/emulation/flexpipe_timeline.py`): both bodies'
requests side by side, the simulator's routing read from its result (`SimResult.dispatched_s`,
`endpoint`, `endpoints_up`)."""

import json
from types import SimpleNamespace

import pytest

from benchmarks.emulation.flexpipe import simulate_one
from benchmarks.emulation.flexpipe_timeline import emulated_rows, main, simulated_rows
from surge.emulation import EmulationConfig

KNOBS = SimpleNamespace(
    rate=8.0,
    duration=1.0,
    seed=1,
    prompt_tokens=512,
    output_tokens=16,
    nodes=8,
    target_ongoing=4.0,
    max_num_seqs=8,
)


def test_the_simulator_reports_where_and_when_each_request_was_routed() -> None:
    config = EmulationConfig.parse("flexpipe:llama2-7b", 10)
    _, res = simulate_one(KNOBS, config, 2.0, "static-2")
    rows, outs = simulated_rows(res)
    assert len(rows) == len(res.arrival_s) > 0
    for r in rows:
        assert r["arrival_s"] <= r["routed_s"] <= r["first_token_s"]
        assert r["endpoint"] in res.endpoints_up
        assert r["stages"] == 2  # static-2: every group, the warm one too, has two stages
    assert outs[0] == {"decided_s": 0.0, "endpoint": rows[0]["endpoint"], "up_s": 0.0, "stages": 2}


def _result(tmp_path, run: dict):
    path = tmp_path / "r.json"
    settings = {k: str(v) for k, v in vars(KNOBS).items()}
    body = {"emulate": "flexpipe:llama2-7b", "time_dilation": 10.0, "settings": settings}
    path.write_text(json.dumps(body | {"emulated": {"2": {"static-2": run}}}))
    return path


def test_both_timelines_are_printed_request_by_request(tmp_path, monkeypatch, capsys) -> None:
    config = EmulationConfig.parse("flexpipe:llama2-7b", 10)
    _, res = simulate_one(KNOBS, config, 2.0, "static-2")
    n = len(res.arrival_s)
    # an emulated run of the same trace: every request routed on arrival, 50 ms to its token
    timeline = [
        [float(a), float(a), float(a) + 0.05, None, None, ["fp7b-p"]] for a in res.arrival_s
    ]
    run = {
        "request_timeline": timeline,
        "flexpipe": {"pipelines": [{"name": "fp7b-p", "stages": [[0, 0, 8], [1, 8, 16]]}]},
    }
    rows, _ = emulated_rows(run)
    assert [r["stages"] for r in rows] == [2] * n
    out = tmp_path / "t.json"
    argv = ["x", "--json", str(_result(tmp_path, run)), "--cv", "2", "--variant", "static-2"]
    monkeypatch.setattr("sys.argv", [*argv, "--out", str(out)])
    main()
    printed = capsys.readouterr().out
    assert printed.count("fp7b-p (2)") == n
    both = json.loads(out.read_text())
    assert len(both["emulated"]["requests"]) == len(both["simulated"]["requests"]) == n


def test_a_run_the_file_lacks_is_one_error_line(tmp_path, monkeypatch, capsys) -> None:
    path = _result(tmp_path, {"request_timeline": []})
    monkeypatch.setattr("sys.argv", ["x", "--json", str(path), "--cv", "4"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("x: error: no emulated run of CV 4 flexpipe") and "static-2" in err
