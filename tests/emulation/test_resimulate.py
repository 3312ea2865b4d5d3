"""`benchmarks.emulation.resimulate`: a result's simulator column rerun on this code, its
emulated runs untouched, the ratios and errors recomputed from both (λScale, ParaServe,
FlexPipe §9 by CV and variant); a file of another benchmark is one `error:` line, exit 2."""

import json
import sys

import pytest

from benchmarks.emulation import paraserve, resimulate
from surge.emulation import EmulationConfig

EMULATED = {"1": 7.0, "4": 2.0, "serverless-vllm": 11.0}


def _paraserve_result() -> dict:
    return {
        "emulate": "paraserve-1:llama2-7b",
        "time_dilation": 10.0,
        "nodes": 4,
        "prompt_len": 512,
        "first_token_s": {"emulated": dict(EMULATED), "simulated": {"1": 1.0, "4": 1.0}},
        "group_speedup": {"emulated": 0.0, "simulated": 0.0},
    }


def test_a_paraserve_result_gets_this_codes_simulator_beside_its_emulated_runs(
    tmp_path, monkeypatch
) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_paraserve_result()))
    monkeypatch.setattr(sys, "argv", ["resimulate", str(path)])
    resimulate.main()
    got = json.loads(path.read_text())
    assert got["first_token_s"]["emulated"] == EMULATED
    config = EmulationConfig.parse("paraserve-1:llama2-7b", 10.0)
    runs = paraserve.variants(4)
    sim = got["first_token_s"]["simulated"]
    assert sim == {n: paraserve.simulated(config, w, s, 512) for n, (w, s) in runs.items()}
    assert sim["1"] > sim["4"] > 0  # the group fetches a quarter each
    assert got["group_speedup"] == {"emulated": 3.5, "simulated": round(sim["1"] / sim["4"], 3)}
    assert got["sim_error"]["4"] == round(sim["4"] / 2.0 - 1, 3)
    assert "commit" in got["simulated_code"]


def test_a_file_of_another_benchmark_is_one_error_line(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"label": "x"}))
    monkeypatch.setattr(sys, "argv", ["resimulate", str(path)])
    with pytest.raises(SystemExit) as exc:
        resimulate.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("resimulate: error:")
    assert "not a lambdascale, paraserve or flexpipe" in err


def test_a_flexpipe_result_gets_this_codes_simulator_per_cv_and_variant(
    tmp_path, monkeypatch
) -> None:
    from benchmarks.emulation import flexpipe

    settings = {
        "nodes": "8", "rate": "8.0", "duration": "2.0", "seed": "1", "prompt_tokens": "512",
        "output_tokens": "128", "target_ongoing": "4.0", "max_num_seqs": "8",
    }  # fmt: skip
    emulated = {"ttft_p50_s": 0.127, "ttft_p90_s": 0.171, "e2e_mean_s": 1.63, "e2e_p99_s": 1.7}
    path = tmp_path / "fp.json"
    path.write_text(
        json.dumps(
            {
                "emulate": "flexpipe:llama2-7b",
                "time_dilation": 10.0,
                "settings": settings,
                "emulated": {"2": {"static-2": emulated}},
                "simulated": {},
                "ratios_to_flexpipe": {},
            }
        )
    )
    monkeypatch.setattr(sys, "argv", ["resimulate", str(path)])
    resimulate.main()
    got = json.loads(path.read_text())
    assert got["emulated"] == {"2": {"static-2": emulated}}
    config = EmulationConfig.parse("flexpipe:llama2-7b", 10.0)
    want = flexpipe.simulated(flexpipe.scenario(settings), config, ["static-2"], [2.0])
    assert got["simulated"] == want
    sim = want["2"]["static-2"]
    ratio = got["sim_over_emulated"]["2"]["static-2"]
    assert ratio["ttft_p50_s"] == round(sim["ttft_p50_s"] / 0.127, 3)
