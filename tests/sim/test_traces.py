"""Trace loaders and transforms."""

from pathlib import Path

import numpy as np
import pytest

from surge.errors import SurgeError
from surge.traces.gamma import gamma_trace
from surge.traces.resolve import AZURE_FILES, default_traces_dir, load_file, load_trace
from surge.traces.transform import assign_models, clip_to_context, scale_rate, time_slice


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_generic_csv_with_models_sorted_by_arrival(tmp_path):
    path = _write(
        tmp_path,
        "t.csv",
        "arrival_s,input_tokens,output_tokens,model\n2.0,10,5,b\n0.5,20,7,a\n1.0,30,0,b\n",
    )
    tr = load_file(path)
    assert tr.arrival_s.tolist() == [0.5, 1.0, 2.0]
    assert tr.model_names == ("a", "b")
    assert tr.model_index.tolist() == [0, 1, 1]
    assert tr.output_tokens.tolist() == [7, 1, 5]  # zero clamped to one


def test_wrong_columns_and_missing_file_are_user_errors(tmp_path):
    bad = _write(tmp_path, "bad.csv", "time,prompt\n1,2\n")
    with pytest.raises(SurgeError, match="arrival_s"):
        load_file(bad)
    with pytest.raises(SurgeError, match="unknown trace"):
        load_trace(str(tmp_path / "nope.csv"))
    notnum = _write(tmp_path, "n.csv", "arrival_s,input_tokens,output_tokens\nx,1,1\n")
    with pytest.raises(SurgeError, match="numbers"):
        load_file(notnum)


def test_burstgpt_schema(tmp_path):
    path = _write(
        tmp_path,
        "burst.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "10,ChatGPT,100,20,120,Conversation log\n"
        "12,GPT-4,50,0,50,Conversation log\n"
        "15,GPT-4,70,30,100,API log\n",
    )
    tr = load_file(path)
    assert tr.num_requests == 2  # the failed (0-token) row is dropped
    assert tr.arrival_s.tolist() == [0.0, 5.0]
    assert [tr.model_names[i] for i in tr.model_index] == ["ChatGPT", "GPT-4"]


def test_azure_slice_parses_timestamps(tmp_path):
    src = default_traces_dir() / AZURE_FILES["azure-code"]
    if not src.is_file():
        pytest.skip("shared traces not present")
    lines = src.read_text().splitlines()[:301]
    tr = load_file(_write(tmp_path, "slice.csv", "\n".join(lines) + "\n"))
    assert tr.num_requests == 300
    assert tr.arrival_s[0] == 0.0 and np.all(np.diff(tr.arrival_s) >= 0)
    h, m, s = lines[300].split(",")[0].split(" ")[1].split(":")
    h0, m0, s0 = lines[1].split(",")[0].split(" ")[1].split(":")
    want = (int(h) - int(h0)) * 3600 + (int(m) - int(m0)) * 60 + float(s) - float(s0)
    assert tr.arrival_s[-1] == pytest.approx(want)


def test_gamma_rate_and_cv_and_seed():
    a = gamma_trace(20.0, 4.0, 2000.0, seed=3)
    b = gamma_trace(20.0, 4.0, 2000.0, seed=3)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    gaps = np.diff(a.arrival_s)
    assert a.num_requests / 2000.0 == pytest.approx(20.0, rel=0.2)
    assert gaps.std() / gaps.mean() == pytest.approx(4.0, rel=0.25)
    p = gamma_trace(20.0, 1.0, 2000.0, seed=3)
    g = np.diff(p.arrival_s)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.1)
    with pytest.raises(SurgeError):
        gamma_trace(-1.0, 1.0, 10.0, 0)


def test_transforms():
    tr = gamma_trace(10.0, 1.0, 100.0, seed=1, input_tokens=4000, output_tokens=500)
    fast = scale_rate(tr, 2.0)
    assert fast.duration_s == pytest.approx(tr.duration_s / 2)
    part = time_slice(tr, 10.0, 20.0)
    assert part.arrival_s.min() >= 0 and part.arrival_s.max() < 20.0
    assert part.num_requests == np.count_nonzero((tr.arrival_s >= 10) & (tr.arrival_s < 30))
    clipped, n = clip_to_context(tr, 4096)
    assert n == tr.num_requests
    assert np.all(clipped.input_tokens + clipped.output_tokens <= 4096)
    multi = assign_models(tr, 12, seed=0)
    assert set(multi.model_index.tolist()) == set(range(12))
    with pytest.raises(SurgeError):
        scale_rate(tr, -1.0)
