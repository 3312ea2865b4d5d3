"""`surge dashboard FILE.json`: a bad file is one `error:` line (exit 2) before anything
listens; a good one is served with the page on 127.0.0.1 until SIGTERM."""

import json
import signal
import subprocess
import sys

import httpx

from surge.events import BlockLanded, NodesKnown, Recorder
from tests.conftest import REPO, run_surge


def test_bad_timeline_files_are_one_error_line(tmp_path) -> None:
    r = run_surge("dashboard", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: timeline file {tmp_path / 'nope.json'} does not exist"
    )
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "surge-timeline/1", "events": [{"type": "warp"}]}')
    r = run_surge("dashboard", str(bad))
    assert r.returncode == 2 and "unknown timeline event 'warp'" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)  # a RecursionError traceback before
    r = run_surge("dashboard", str(deep))
    assert r.returncode == 2 and "nested too deeply" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_serves_the_page_and_the_timeline_until_sigterm(tmp_path) -> None:
    rec = Recorder()
    rec.publish(NodesKnown(t_s=0.1, nodes=(0, 1)))
    rec.publish(BlockLanded(t_s=0.2, model="m", node=1, block=0, tier="gpu"))
    path = tmp_path / "t.json"
    rec.timeline("test").write(path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "surge.cli", "dashboard", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        text=True,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["events"] == 2 and info["url"].startswith("http://127.0.0.1:")
        page = httpx.get(info["url"], timeout=10)
        assert page.status_code == 200 and "dashboard.js" in page.text
        base = info["url"].split("/dashboard")[0]
        got = httpx.get(base + "/dashboard/timeline.json", timeout=10).json()
        assert got == json.loads(path.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        proc.stdout.close()
