"""The dashboard in a real browser (Debian's headless chromium over CDP) against a live
`surge serve`: a burst makes the autoscaler scale out, and the page shows the new instances
and the execution pipeline lambdascale opens across the receivers while they load, within a
few seconds of the server reporting them; a screenshot is saved in the test's temp dir. The
page's own recording, replayed by `surge dashboard FILE.json`, renders the same elements.

Bounded: four agents on capped links (0.02 Gbit/s, ~0.4 s a block) so the multicast lasts
seconds, eight requests, every process stopped by PID at the end."""

import asyncio
import importlib.util
import itertools
import json
import selectors
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.control.conftest import Serve, start_serve
from tests.dashboard.browser import Chromium, find_chromium

pytestmark = [
    pytest.mark.skipif(
        find_chromium() is None,
        reason="no chromium: install Debian's (apt-get install chromium; .ci/run and "
        "setup.sh do) to run the dashboard's browser test",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("websocket") is None,
        reason="no websocket-client (a dev dependency: pip install -e '.[dev]')",
    ),
]

MODEL = "surge-tiny"
SEEN_WITHIN_S = 3.0
"""How soon after the server reports an instance or pipeline the page must show it."""

SERVING = "document.querySelectorAll('.node-row[data-serving=\"1\"]').length"
PIPELINES = "[...document.querySelectorAll('.pipeline')].map(p => [p.dataset.name, \
[...p.querySelectorAll('.stage')].map(s => s.title)])"
STRATEGY = "document.querySelector('.deployment .strategy')?.textContent"


def _status(s: Serve) -> dict:
    """The deployment's status: `instances` serving, `nodes` with an instance (serving or
    loading), `pipelines` serving while loading."""
    return s.http.get(f"/v1/deployments/{MODEL}").json()["status"]


async def _burst(url: str, n: int, max_tokens: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens}
        rs = await asyncio.gather(
            *(c.post("/v1/completions", json={**body, "ignore_eos": True}) for _ in range(n))
        )
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]


def _replay_server(path: Path, tmp: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "surge.cli", "dashboard", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=open(tmp / "dashboard.log", "w"),  # noqa: SIM115 (the process keeps it)
        cwd=REPO,
        text=True,
    )
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if sel.select(0.2):
            info = json.loads(proc.stdout.readline())
            return proc, info["url"]
    proc.kill()
    raise AssertionError(f"surge dashboard did not start: {(tmp / 'dashboard.log').read_text()}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_live_scale_out_in_the_browser_then_its_replay(tmp_path, surge_home, tiny_store_dir):
    config = {
        "nodes": 4,
        "link_gbps": 0.02,
        "max_num_seqs": 1,  # one request per instance: the burst waits for new capacity
        "deployments": [
            {
                "name": MODEL,
                "model": str(tiny_store_dir),
                "strategy": "lambdascale",
                "autoscaling": {
                    "min_replicas": 2,  # two GPU copies: K=2 sources, a pipeline in the plan
                    "max_replicas": 4,
                    "target_ongoing_requests": 2,
                    # The burst's 8 requests reach the controller over a few ticks; without a
                    # delay a tick that saw 5 added one instance (no pipeline: one receiver),
                    # seen once in CI under load. Panic (all 8) or the delay's end adds two.
                    "upscale_delay_s": 0.5,
                    "keep_alive_s": 60,
                    "downscale_delay_s": 60,
                },
            }
        ],
    }
    serve = start_serve(tmp_path, surge_home, config)
    browser = None
    replay = None
    try:
        deadline = time.monotonic() + 60
        while _status(serve)["instances"] < 2:
            assert time.monotonic() < deadline, "two first instances"
            time.sleep(0.1)
        before = set(_status(serve)["nodes"])
        browser = Chromium(tmp_path)
        browser.goto(serve.url + "/dashboard")
        browser.wait(f"{SERVING} === 2", 15, "the two first instances")
        assert browser.eval(STRATEGY) == "lambdascale"

        loop_thread = asyncio.new_event_loop()
        burst = loop_thread.run_in_executor(None, asyncio.run, _burst(serve.url, 8, 96))
        # The server reports a pipeline, then a new instance; the page must show each soon.
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 60
        while "instance" not in seen:
            assert time.monotonic() < deadline, f"no scale-out on the server ({seen})"
            st = _status(serve)
            if st["pipelines"] and "pipeline" not in seen:
                seen["pipeline"] = time.monotonic()
            if st["instances"] > 2:
                seen["instance"] = time.monotonic()
            time.sleep(0.05)
        try:
            lag_s = browser.wait(f"{SERVING} >= 3", SEEN_WITHIN_S, "the new instance")
            if "pipeline" in seen:  # the page lists retired pipelines too
                browser.wait(PIPELINES + ".length", SEEN_WITHIN_S, "the pipeline")
        except AssertionError:
            browser.screenshot(tmp_path / "dashboard-failure.png")
            raise
        # The pipeline lambdascale opened across the receivers while they loaded: its
        # stages are new nodes and their layer ranges tile the model.
        pipes = browser.eval(PIPELINES)
        assert pipes, "no execution pipeline on the page"
        name, stages = pipes[0]
        assert name.startswith(f"{MODEL}-pipe"), name
        nodes = [int(t.split(":")[0].split()[1]) for t in stages]
        assert len(nodes) >= 2 and not set(nodes) & before, (stages, before)
        spans = [tuple(map(int, t.split("layers ")[1].split("–"))) for t in stages]
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        loop_thread.run_until_complete(burst)
        loop_thread.close()
        browser.wait(f"{SERVING} === 4", 30, "all four instances")
        shot = browser.screenshot(tmp_path / "dashboard-live.png")
        assert shot.stat().st_size > 10_000
        print(f"page showed the new instance {lag_s:.2f} s after the server; {shot}")

        live = {
            "serving": browser.eval(SERVING),
            "pipelines": browser.eval(PIPELINES),
            "strategy": browser.eval(STRATEGY),
            "cells": browser.eval("document.querySelectorAll('.cell.tier-gpu').length"),
        }
        recorded = browser.eval("JSON.stringify(surgeDashboard.timeline())")
        path = tmp_path / "timeline.json"
        path.write_text(recorded)

        replay, url = _replay_server(path, tmp_path)
        browser.goto(url + "&speed=max")
        browser.wait("document.body.dataset.replayDone === '1'", 15, "the whole replay")
        browser.wait(f"{SERVING} === {live['serving']}", 5, "the replayed instances")
        assert browser.eval(PIPELINES) == live["pipelines"]
        assert browser.eval(STRATEGY) == live["strategy"]
        assert browser.eval("document.querySelectorAll('.cell.tier-gpu').length") == live["cells"]
        browser.screenshot(tmp_path / "dashboard-replay.png")
    finally:
        if browser is not None:
            browser.close()
        if replay is not None:
            _stop(replay)
        serve.stop()
