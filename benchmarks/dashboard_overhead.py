"""What the dashboard's event stream costs the serving path: throughput with no page open
and with one open, in the same run.

What runs: one `surge serve` (loopback agents, the default tiny model kept warm on every
node: `min_replicas` = nodes, so no scale-out happens during the rounds), then rounds of
`--requests` completions at `--concurrency`, alternating no page / one page (ABAB..., so a
drift of the shared machine's load falls on both alike). "One page" is a reader of
`GET /dashboard/events` consuming the stream as a browser's EventSource does (the
snapshot, then every event: blocks, requests, per-tick load). Requests per second and
tokens per second of each round; the medians and their ratio (page / no page) are written
to benchmarks/results/dashboard_overhead.json with the machine and settings, beside the
cost per event with no page open (a `publish` nobody hears, and the `active` check the
per-request publisher makes instead), timed in process. The events the
reader saw are written as a timeline (benchmarks/results/dashboard_timeline.json), the
format `surge dashboard FILE` replays.

Run: `python -m benchmarks.dashboard_overhead [--rounds 6] [--requests 48] [--concurrency 8]`.
"""

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from surge.cli import serve_process
from surge.events import Recorder, TimelineEvent

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "dashboard_overhead.json"
TIMELINE_OUT = REPO / "benchmarks" / "results" / "dashboard_timeline.json"
MODEL = "surge-tiny"
STARTUP_TIMEOUT_S = 600.0
"""How long `surge serve` may take to have the model warm on every node."""


def start_serve(work: Path, nodes: int) -> tuple[subprocess.Popen, str]:
    """`surge serve` with the tiny model warm on every node; its process and URL."""
    cfg = {
        "nodes": nodes,
        "deployments": [
            {"name": MODEL, "model": "", "autoscaling": {"min_replicas": nodes}},
        ],
    }
    env = {**os.environ, "SURGE_HOME": str(work / "home")}
    from surge.model.default_store import default_store

    os.environ["SURGE_HOME"] = env["SURGE_HOME"]
    cfg["deployments"][0]["model"] = str(default_store())
    (work / "serve.yaml").write_text(yaml.safe_dump(cfg))
    args = ["--port", "0", "--config", str(work / "serve.yaml"), "--state-dir", str(work / "state")]
    proc, ready = serve_process.start_serve(
        args, work / "serve.log", env=env, cwd=REPO, timeout_s=STARTUP_TIMEOUT_S
    )
    return proc, ready["url"]


def wait_warm(url: str, nodes: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = httpx.get(f"{url}/v1/deployments/{MODEL}", timeout=10).json()["status"]
        if st["instances"] >= nodes:
            return
        time.sleep(0.2)
    raise RuntimeError("the instances did not come up")


async def one_round(url: str, num_requests: int, concurrency: int, max_tokens: int) -> dict:
    """`num_requests` completions, `concurrency` at a time; requests and tokens per second."""
    sem = asyncio.Semaphore(concurrency)
    tokens = 0
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens}

    async with httpx.AsyncClient(base_url=url, timeout=120) as c:

        async def one(i: int) -> None:
            nonlocal tokens
            async with sem:
                r = await c.post("/v1/completions", json={**body, "seed": i, "ignore_eos": True})
                r.raise_for_status()
                tokens += r.json()["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(num_requests)))
        wall_s = time.perf_counter() - t0
    return {"wall_s": wall_s, "req_per_s": num_requests / wall_s, "tok_per_s": tokens / wall_s}


class Page:
    """One open dashboard: a thread reading `/dashboard/events` as an EventSource does."""

    def __init__(self, url: str, recorder: Recorder) -> None:
        self.url, self.recorder = url, recorder
        self.num_events = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        with (
            httpx.Client(timeout=httpx.Timeout(10, read=None)) as c,
            c.stream("GET", f"{self.url}/dashboard/events") as r,
        ):
            self._ready.set()
            for line in r.iter_lines():
                if self._stop.is_set():
                    return
                if line.startswith("data: "):
                    self.num_events += 1
                    self.recorder.publish(TimelineEvent.decode(json.loads(line[6:])))

    def __enter__(self) -> "Page":
        self._thread.start()
        assert self._ready.wait(10), "the event stream did not open"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # the next event (a tick's load, within 0.1 s) ends the read
        self._thread.join(10)


def idle_publish_ns(n: int = 200_000) -> dict[str, float]:
    """What the serving path pays per event with no page open, in nanoseconds: a
    `publish` with no subscriber (the scale-out events), and the `active` check the
    per-request and per-tick publishers make instead of building an event."""
    from surge.events import BlockLanded, EventBus

    bus = EventBus()
    ev = BlockLanded(model="m", node=0, block=0, tier="gpu")
    t0 = time.perf_counter_ns()
    for _ in range(n):
        bus.publish(ev)
    publish = (time.perf_counter_ns() - t0) / n
    t0 = time.perf_counter_ns()
    for _ in range(n):
        if bus.active:
            raise AssertionError("nobody subscribed")
    check = (time.perf_counter_ns() - t0) / n
    return {"publish_no_subscriber_ns": publish, "active_check_ns": check}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each kind (ABAB...)")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--timeline", type=Path, default=TIMELINE_OUT)
    args = ap.parse_args()
    rounds: dict[str, list[dict]] = {"no_page": [], "one_page": []}
    recorder = Recorder()
    num_events = 0
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_serve(Path(tmp), args.nodes)
        try:
            wait_warm(url, args.nodes)
            run = (args.requests, args.concurrency, args.max_tokens)
            asyncio.run(one_round(url, args.concurrency, args.concurrency, args.max_tokens))
            for i in range(2 * args.rounds):
                kind = "no_page" if i % 2 == 0 else "one_page"
                if kind == "one_page":
                    with Page(url, recorder) as page:
                        rounds[kind].append(asyncio.run(one_round(url, *run)))
                    num_events += page.num_events
                else:
                    rounds[kind].append(asyncio.run(one_round(url, *run)))
                r = rounds[kind][-1]
                print(f"{kind:9s} {r['req_per_s']:.2f} req/s {r['tok_per_s']:.1f} tok/s")
        finally:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("req_per_s", "tok_per_s")}
           for k, v in rounds.items()}  # fmt: skip
    ratio = {m: med["one_page"][m] / med["no_page"][m] for m in ("req_per_s", "tok_per_s")}
    result: dict[str, Any] = {
        "benchmark": "dashboard_overhead",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "timeline")},
        "rounds": rounds,
        "median": med,
        "ratio_one_page_over_no_page": ratio,
        "events_streamed_to_the_page": num_events,
        "idle_cost_per_event": idle_publish_ns(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    recorder.timeline("benchmarks/dashboard_overhead (surge serve)").write(args.timeline)
    idle = result["idle_cost_per_event"]
    print(json.dumps({"median": med, "ratio": ratio, "events": num_events, "idle": idle}, indent=2))


if __name__ == "__main__":
    main()
