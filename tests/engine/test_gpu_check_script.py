"""`benchmarks/gpu_check.py --device cpu` runs to the end (small shapes, the sharing agents
on the fake GPU, the CUDA-graph path re-run eagerly), so the GPU check is never stale when a
GPU machine finally runs it: every part reports numbers, none an error, the two agents of
the host group agree, and the graph path gives the eager tokens."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--out", str(out)]
    cmd += ["--work-dir", str(tmp_path / "work")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for name in ("link", "warm", "decode", "engine", "hf", "graphs", "share"):
        assert "error" not in result[name], (name, result[name].get("error"))
    for size in ("8MiB", "32MiB"):
        rates = result["link"][size]
        assert min(rates["pageable_gbps"], rates["pinned_gbps"], rates["registered_shm_gbps"]) > 0
    assert result["warm"]["bytes"] == result["store"]["bytes"] > 0
    assert 0 < result["warm"]["copied_s"] <= result["warm"]["first_token_s"]
    assert result["decode"]["b1_ms"] > 0 and result["decode"]["b8_ms"] > 0
    assert result["engine_vs_transformers"]["decode_tokens_per_s_ratio"] > 0
    assert result["engine_vs_transformers"]["same_first_tokens"] == 8  # float32: exact
    assert result["engine"]["dtype"] == "float32" and result["engine"]["decode_path"] == "eager"
    graphs = result["graphs"]  # the graph path's code ran (re-run on the CPU), same tokens
    assert graphs["same_tokens"] is True and graphs["replays"] > 0
    assert {b for b, _ in graphs["buckets"]} == {1, 8}
    assert result["verdict"]["graphs_same_tokens"] is True
    assert result["share"]["same_tokens"] is True
    assert result["verdict"]["share_same_tokens"] is True
    assert result["verdict"]["warm_start"] is None, "no GPU bar is judged on the CPU"
    table = proc.stderr[proc.stderr.index("| part | measure | value |") :]  # for docs/gpu.md
    assert "| verdict | graphs_same_tokens | True |" in table
    assert "| engine | decode_path | eager |" in table and "token_ids" not in table
