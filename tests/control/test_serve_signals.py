"""`surge serve` start and stop (issue 14 #6, #8): a busy port is one `error:` line and exit 2
before anything starts; a terminal's Ctrl-C (SIGINT to the whole process group) stops it
cleanly: exit 0, no traceback, no "node N is down", no resource_tracker warnings, no agent
or shared-memory segment left."""

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from surge.cli.serve_process import serve_command, start_serve
from surge.model.manifest import read_manifest
from tests.conftest import REPO, run_surge
from tests.control.conftest import process_alive


def _serve_args(tmp: Path, port: int, *args: str) -> list[str]:
    return ["--port", str(port), "--state-dir", str(tmp / "state"), *args]


def test_a_busy_port_is_one_error_line_before_anything_starts(tmp_path, surge_home):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        env = {**os.environ, "SURGE_HOME": str(surge_home)}
        t0 = time.monotonic()
        r = subprocess.run(
            serve_command(*_serve_args(tmp_path, port, "--nodes", "2")),
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
        )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0] and "--port" in lines[0]
    assert not (tmp_path / "state").exists(), "the controller started before the port check"
    assert time.monotonic() - t0 < 30


def test_ctrl_c_stops_serve_cleanly(tmp_path, surge_home, tiny_store_dir):
    """Also: `surge deploy` of a damaged store, or of a min_replicas beyond the cluster, is
    one error line and exit 2 (issue 14 #2, #3)."""
    env = {**os.environ, "SURGE_HOME": str(surge_home)}
    before = {f.name for f in Path("/dev/shm").glob("surge_*")}
    err = tmp_path / "serve.err"
    # Its own process group with SIGINT's default action, like a terminal's foreground job.
    args = _serve_args(tmp_path, 0, "--nodes", "2")
    proc, info = start_serve(args, err, env=env, cwd=REPO, own_session=True)
    try:
        with httpx.Client(base_url=info["url"], timeout=60) as http:
            pids = [n["pid"] for n in http.get("/v1/nodes").json()["data"]]
            r = http.post(
                "/v1/completions",
                json={"model": "surge-tiny", "prompt": "hi", "max_tokens": 8},
            )
            assert r.status_code == 200, r.text
        bad = tmp_path / "bad"
        shutil.copytree(tiny_store_dir, bad)
        block = bad / read_manifest(bad).blocks[0].file
        data = bytearray(block.read_bytes())
        data[-1] ^= 0xFF
        block.write_bytes(bytes(data))
        cli_env = {**env, "SURGE_URL": info["url"]}
        for args, words in (
            (("bad", "--model", str(bad)), ("block 0", "checksum", "HTTP 400")),
            (
                ("many", "--model", str(tiny_store_dir), "--min-replicas", "1000"),
                ("2 nodes x 1 slots", "at most 2 instances"),
            ),
        ):
            out = run_surge("deploy", *args, env=cli_env)
            lines = out.stderr.strip().splitlines()
            assert out.returncode == 2 and len(lines) == 1, out.stderr
            assert lines[0].startswith("error: ") and all(w in lines[0] for w in words), lines
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        proc.stdout.close()
    text = err.read_text()
    assert rc == 0, text
    for bad in ("Traceback", "is down", "leaked", "resource_tracker", "Aborted", "WARNING"):
        assert bad not in text, text
    time.sleep(0.5)
    assert not [p for p in pids if p and process_alive(p)], "an agent outlived surge serve"
    new = [f for f in Path("/dev/shm").glob("surge_*") if f.name not in before]
    left = [f.name for f in new if _owner_gone(f)]
    assert not left, left


def _owner_gone(f: Path) -> bool:
    """A segment no live process maps (segments of other tests' clusters are in use)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if f.name in Path(f"/proc/{pid}/maps").read_text():
                return False
        except OSError:
            continue
    return True


def test_sigterm_ends_open_requests_with_the_shutdown_error(serve_factory, tiny_store_dir):
    """Responses still open after the 5-s grace end as docs/api.md says: a 503 `... stopped:
    the server is shutting down ...`, a stream's error event and `[DONE]`. uvicorn used to
    cancel them first: a plain-text `Internal Server Error` with a traceback in the log, a
    stream cut off mid-way (walked: SIGTERM during two 400-token SmolLM2 answers)."""
    import threading

    keep = {"min_replicas": 1, "keep_alive_s": 600, "target_ongoing_requests": 100}
    s = serve_factory(
        {
            "nodes": 1,
            "deployments": [{"name": "a", "model": str(tiny_store_dir), "autoscaling": keep}],
        }
    )
    long = {"model": "a", "prompt": "once upon a time", "max_tokens": 2000, "ignore_eos": True,
            "n": 16}  # fmt: skip
    got: dict = {}

    def plain() -> None:
        got["plain"] = httpx.post(s.url + "/v1/completions", json=long, timeout=120)

    def stream() -> None:
        body = {**long, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=120) as r:
            got["stream"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    threads = [threading.Thread(target=f) for f in (plain, stream)]
    for t in threads:
        t.start()
    s.wait_ongoing("a", 32)
    s.proc.send_signal(signal.SIGTERM)
    rc = s.proc.wait(90)
    for t in threads:
        t.join(30)
    log = (s.state_dir.parent / "serve.log").read_text()
    assert rc == 0 and "Traceback" not in log, log[-3000:]
    r = got["plain"]
    assert r.status_code == 503, r.text
    assert "the server is shutting down" in r.json()["error"]["message"], r.text
    lines = got["stream"]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    assert "the server is shutting down" in lines[-2] and '"error"' in lines[-2], lines[-3:]
