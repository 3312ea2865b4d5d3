"""Nodes that heal (issue 36): a killed agent is replaced (bounded restarts with backoff) and
`/health` says degraded meanwhile; a frozen agent (SIGSTOP) misses its heartbeat, is treated
as down (its stream finishes elsewhere instead of stalling) and replaced."""

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from surge.policy.nodes.node_health import RESTART_RESET_S, restart_delay_s, restarts_in_a_row
from tests.control.conftest import Serve, start_serve
from tests.control.test_serve_openai import wait_for

KEEP = {"min_replicas": 1, "keep_alive_s": 600, "target_ongoing_requests": 100}


def test_restart_backoff_is_bounded() -> None:
    assert [restart_delay_s(n, 5) for n in range(7)] == [1, 2, 4, 8, 16, None, None]
    assert restart_delay_s(9, 20) == 30  # capped
    assert restarts_in_a_row(4, 100.0, 100.0 + RESTART_RESET_S) == 0
    assert restarts_in_a_row(4, 100.0, 150.0) == 4


@pytest.fixture
def server(tmp_path: Path, surge_home: Path, tiny_store_dir: Path) -> Iterator[Serve]:
    config = {"nodes": 2, "deployments": [{"name": "m", "model": str(tiny_store_dir),
                                           "autoscaling": KEEP}]}  # fmt: skip
    s = start_serve(tmp_path, surge_home, config)
    yield s
    s.stop()


def _nodes(s: Serve) -> list[dict]:
    return s.http.get("/v1/nodes").json()["data"]


def _serving_pid(s: Serve) -> int:
    wait_for(lambda: any("m" in n["instances"] for n in _nodes(s)), 60, "an instance")
    return next(n["pid"] for n in _nodes(s) if "m" in n["instances"])


def _stop_new_agents(s: Serve) -> None:
    """Agents started by restarts are not in the fixture's list: stopped with the server."""
    s.agent_pids = [n["pid"] for n in _nodes(s)]


def test_a_killed_agent_is_replaced_and_health_says_degraded_meanwhile(server: Serve) -> None:
    victim = _serving_pid(server)
    os.kill(victim, signal.SIGKILL)
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        h = server.http.get("/health").json()
        seen.append(h["status"])
        if h["status"] == "ok" and "degraded" in seen:
            break
        time.sleep(0.05)
    assert "degraded" in seen, seen[:5]
    assert seen[-1] == "ok", "the node did not come back"
    pids = [n["pid"] for n in _nodes(server)]
    assert victim not in pids and all(n["up"] for n in _nodes(server))
    _stop_new_agents(server)
    r = server.http.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 4})
    assert r.status_code == 200, r.text


def _gone(pid: int) -> bool:
    """The process has exited or is a zombie. It may exit between any two looks at it, so a
    vanished process counts as gone however it is asked (a pid_exists-then-Process race
    failed CI once)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_frozen_agent_is_treated_as_down_and_replaced(server: Serve) -> None:
    victim = _serving_pid(server)
    answer: dict = {}
    streaming = threading.Event()

    def stream() -> None:
        body = {"model": "m", "prompt": "once", "max_tokens": 400, "ignore_eos": True,
                "stream": True}  # fmt: skip
        lines = []
        with httpx.Client(base_url=server.url, timeout=120) as c:
            t0 = time.monotonic()
            with c.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    if line.startswith("data: {"):
                        streaming.set()  # a token came: the agent is generating it
            answer["s"], answer["text"] = time.monotonic() - t0, "\n".join(lines)

    t = threading.Thread(target=stream)
    t.start()
    # Frozen mid-stream, at its first token (a fixed 0.3 s after the request was counted
    # could come before its first token or, on a fast machine, after its last).
    assert streaming.wait(30), "no token streamed"
    os.kill(victim, signal.SIGSTOP)
    try:
        assert t.is_alive(), "the stream had ended before the freeze: it tested nothing"
        t.join(90)
        assert not t.is_alive(), "the stream stalled on the frozen agent"
        events = [x[6:] for x in answer["text"].splitlines() if x.startswith("data: ")]
        assert events[-1] == "[DONE]"
        finish = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]
                  if "choices" in json.loads(e) and json.loads(e)["choices"]]  # fmt: skip
        assert finish[-1] == "length", events[-3:]  # re-run elsewhere, to its end
        wait_for(lambda: _gone(victim), 60, "the frozen agent killed")
        wait_for(lambda: server.http.get("/health").json()["status"] == "ok", 60, "replaced")
        _stop_new_agents(server)
    finally:  # the controller may kill it at the same moment: gone by now is fine
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
