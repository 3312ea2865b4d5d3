"""`surge simulate` as a user runs it."""

import json

from tests.conftest import run_surge


def test_simulate_writes_json_and_png(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival_s,input_tokens,output_tokens\n"
        + "".join(f"{i * 0.05:.2f},256,16\n" for i in range(100))
    )
    out, png = tmp_path / "o.json", tmp_path / "o.png"
    r = run_surge(
        "simulate",
        "--trace",
        str(trace),
        "--system",
        "lambdascale",
        "--system",
        "ideal",
        "--json",
        str(out),
        "--png",
        str(png),
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert set(doc["systems"]) == {"lambdascale", "ideal"}
    # the keys the JSON schema names
    keys = set(
        [
            "requests",
            "ttft_p50_s",
            "ttft_p90_s",
            "ttft_p99_s",
            "tpot_p50_s",
            "tpot_p90_s",
            "slo_attainment",
            "gpu_seconds",
            "cache_hits",
            "cache_misses",
        ]
    )
    assert keys <= set(doc["systems"]["ideal"])
    assert doc["systems"]["ideal"]["requests"] == 100
    assert png.stat().st_size > 1000
    assert "lambdascale" in r.stdout


def test_bad_inputs_exit_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    for args in (
        ("--cluster", "nope"),
        ("--trace", str(bad)),
        ("--rate-scale", "-1"),
        ("--system", "nope"),
        ("--block-count", "nope"),
    ):
        r = run_surge("simulate", *args)
        assert r.returncode == 2, args
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
