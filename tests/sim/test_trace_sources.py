"""Trace sources with many models: Alibaba GenAI base models, ServeGen clients, and
trace files found under --traces-dir."""

import gzip
from pathlib import Path

import numpy as np
import pytest

from surge.errors import SurgeError
from surge.traces.alibaba_genai import load_alibaba_genai
from surge.traces.resolve import load_trace
from surge.traces.servegen import servegen_trace


def test_alibaba_genai_models_ranked_by_requests_failed_dropped(tmp_path):
    path = tmp_path / "lora.csv"
    path.write_text(
        "gmt_create,predict_type,predict_status,checkpoint_model_version_id,num_lora\n"
        "2024-11-15 10:00:00,TXT_2_IMG,SUCCEED,M7,0\n"
        "2024-11-15 10:00:30,TXT_2_IMG,SUCCEED,M3,0\n"
        "2024-11-15 10:01:00,TXT_2_IMG,FAILED,M3,0\n"
        "2024-11-15 10:02:00,TXT_2_IMG,SUCCEED,M3,1\n"
    )
    tr = load_alibaba_genai(path)
    assert tr.arrival_s.tolist() == [0.0, 30.0, 120.0]
    assert tr.model_names == ("M3", "M7")  # M3 has more succeeded requests
    assert [tr.model_names[i] for i in tr.model_index] == ["M7", "M3", "M3"]
    bad = tmp_path / "bad.csv"
    bad.write_text("gmt_create,checkpoint_model_version_id\nyesterday,M1\n")
    with pytest.raises(SurgeError, match="gmt_create"):
        load_alibaba_genai(bad)


def test_servegen_model_index_is_client_rank(tmp_path):
    path = tmp_path / "x_client_windows.csv.gz"
    rows = "client_id,window_start_s,rate_rps,iat_cv\n5,0,0.5,1.0\n9,0,4.0,1.0\n2,0,0,0\n"
    with gzip.open(path, "wt") as fh:
        fh.write(rows)
    tr = servegen_trace(path, 0.0, 600.0, seed=1)
    counts = np.bincount(tr.model_index)
    assert tr.model_names == ("client-9", "client-5")
    assert counts[0] > 4 * counts[1] > 0  # client 9 sends 8x the rate of client 5


def test_relative_path_resolves_under_traces_dir(tmp_path, monkeypatch):
    sub = tmp_path / "mine"
    sub.mkdir()
    (sub / "burst.csv").write_text(
        "Timestamp,Model,Request tokens,Response tokens\n3,ChatGPT,10,5\n4,GPT-4,10,5\n"
    )
    monkeypatch.chdir(Path("/"))
    tr = load_trace("mine/burst.csv", traces_dir=tmp_path)
    assert tr.num_requests == 2 and tr.model_names == ("ChatGPT", "GPT-4")
    with pytest.raises(SurgeError, match="not a file"):
        load_trace("mine/none.csv", traces_dir=tmp_path)
