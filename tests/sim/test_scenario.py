"""Multi-model scenarios: parsing and validation, the merged trace, and host caches that
miss when models compete for host memory."""

import json

import numpy as np
import pytest

from surge.errors import SurgeError
from surge.sim.scenario import load_scenario, parse_scenario, scenario_presets
from surge.sim.scenario_traffic import build_trace
from surge.sim.simulator import Simulation
from tests.conftest import run_surge


def _trace(tmp_path, rows):
    path = tmp_path / "t.csv"
    path.write_text(
        "arrival_s,input_tokens,output_tokens\n" + "".join(f"{t},128,8\n" for t in rows)
    )
    return str(path)


def _doc(trace, host_memory_gib=40, **extra):
    doc = {
        "name": "two",
        "cluster": {
            "preset": "lambdascale-testbed1",
            "num_nodes": 1,
            "host_memory_gib": host_memory_gib,
        },
        "models": [
            {
                "name": "chat",
                "profile": "llama2-7b",
                "count": 2,
                "arrivals": {"trace": trace, "split": "round-robin"},
            }
        ],
        "systems": ["serverlessllm", "allcache"],
        "system_overrides": {"serverlessllm": {"host_cache_fraction": 0.5}},
    }
    doc.update(extra)
    return doc


def test_groups_models_and_overrides(tmp_path):
    t = _trace(tmp_path, [0, 1, 2, 3, 4, 5])
    doc = _doc(t)
    doc["models"].append(
        {"name": "code", "profile": "llama2-13b", "arrivals": {"trace": t, "share": 1.0}}
    )
    sc = parse_scenario(doc)
    assert sc.model_names == ("chat/0", "chat/1", "code/0")
    assert sc.cluster.groups[0].num_nodes == 1
    assert sc.cluster.groups[0].host_memory_bytes == 40 * 2**30
    assert sc.system("serverlessllm").host_cache_fraction == 0.5
    tr = build_trace(sc)
    assert tr.num_requests == 12
    chat = tr.model_index[tr.model_index < 2]
    assert chat.tolist() == [0, 1, 0, 1, 0, 1]  # round-robin in arrival order
    assert np.count_nonzero(tr.model_index == 2) == 6


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"models": []}, "models"),
        ({"bogus": 1}, "unknown field"),
        ({"systems": ["nope"]}, "unknown system"),
        ({"system_overrides": {"serverlessllm": {"host_cache_fraction": 7}}}, "fraction"),
        ({"system_overrides": {"serverlessllm": {"colour": 1}}}, "unknown field"),
        ({"cluster": {"preset": "lambdascale-testbed1", "host_memory_gib": -1}}, "memory"),
        ({"warm": -1}, "warm"),
    ],
)
def test_bad_scenarios_name_the_field(tmp_path, patch, match):
    doc = _doc(_trace(tmp_path, [0]))
    doc.update(patch)
    with pytest.raises(SurgeError, match=match):
        parse_scenario(doc)
    doc = _doc(_trace(tmp_path, [0]))
    doc["models"][0]["arrivals"]["split"] = "random"
    with pytest.raises(SurgeError, match="split"):
        parse_scenario(doc)


def _run(sc, system):
    tr = build_trace(sc)
    return Simulation(tr, sc.settings(system), sc.system(system)).run()


def test_models_competing_for_host_memory_miss(tmp_path):
    """Two 7B models take turns, 30 s apart (past the instances' keep-alive). A host cache
    of 20 GB holds one of them: every load misses (LRU evicts the other). 100 GB holds
    both: only the first load of each misses. AllCache never misses."""
    t = _trace(tmp_path, [i * 30.0 for i in range(6)])
    small = _run(parse_scenario(_doc(t, host_memory_gib=40)), "serverlessllm")
    big = _run(parse_scenario(_doc(t, host_memory_gib=200)), "serverlessllm")
    assert small.cache_misses == 6 and small.cache_hits == 0
    assert len(small.cache_lifetimes_s) >= 4  # evicted entries' lifetimes recorded
    assert big.cache_misses == 2 and big.cache_hits == 4
    every = _run(parse_scenario(_doc(t, host_memory_gib=40)), "allcache")
    assert every.cache_misses == 0
    ttft = lambda r: float(np.mean(r.first_token_s - r.arrival_s))  # noqa: E731
    assert ttft(small) > ttft(big) > ttft(every) * 0.99


def test_bundled_scenarios_parse():
    assert "lambdascale-multi" in scenario_presets()
    for name in scenario_presets():
        sc = load_scenario(name)
        assert sc.groups and sc.systems


def test_cli_scenario_file_and_errors(tmp_path):
    t = _trace(tmp_path, [0, 0.5, 1, 1.5])
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_doc(t)))
    out = tmp_path / "o.json"
    r = run_surge("simulate", "--scenario", str(path), "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert set(doc["systems"]) == {"serverlessllm", "allcache"}
    assert doc["systems"]["allcache"]["requests"] == 4
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc(t, models=[{"name": "x", "profile": "gpt-9"}])))
    for args in (
        ("--scenario", str(bad)),
        ("--scenario", str(tmp_path / "none.json")),
        ("--scenario", str(path), "--trace", "azure-code"),
    ):
        r = run_surge("simulate", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr


def test_group_slos_and_generator_seeds(tmp_path):
    gen = {"trace": "gamma:rate=2,cv=2,duration=60,in=64,out=8"}
    doc = _doc(_trace(tmp_path, [0]))
    doc["models"] = [
        {"name": "a", "profile": "llama2-7b", "count": 2, "arrivals": gen},
        {"name": "b", "profile": "llama2-7b", "arrivals": gen, "slo": {"ttft_s": 15.0}},
    ]
    sc = parse_scenario(doc)
    settings = sc.settings("serverlessllm")
    assert settings.slo_of("b/0").ttft_s == 15.0
    assert settings.slo_of("a/1").ttft_s == sc.slo.ttft_s == 5.0
    tr = build_trace(sc)
    a, b = tr.arrival_s[tr.model_index < 2], tr.arrival_s[tr.model_index == 2]
    assert len(a) and len(b) and not np.array_equal(a[: len(b)], b[: len(a)])
    doc["models"][1]["arrivals"] = {**gen, "seed": 0}
    doc["models"][0]["arrivals"] = {**gen, "seed": 0}
    tr = build_trace(parse_scenario(doc))
    a, b = tr.arrival_s[tr.model_index < 2], tr.arrival_s[tr.model_index == 2]
    assert np.array_equal(a, b)  # one seed named: one arrival process
