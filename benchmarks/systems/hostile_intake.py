"""Hostile intake (issue 36): what one oversized request costs `surge serve`, before vs after.

For each code tree given (`--code LABEL=DIR`, e.g. the commit before the fix and after it) and
each case, a fresh `surge serve --nodes 1` (default settings, the default tiny model) gets one
request while a sampler polls `/health` every 20 ms and reads the controller's RSS:
- `body300_declared`: a 300 MB JSON body (one long prompt) with its Content-Length;
- `body300_chunked`: the same body with no length (chunked transfer);
- `prompt8mb`: an 8 MB text prompt in a body the server accepts.
Reported per case: the answer (status, seconds), the controller's peak RSS over its idle RSS,
/health's worst and median latency during the request. A server past `--rss-cap-gb` is killed
(the old code would grow until the kernel's OOM killer acted; the cap keeps this machine up)
and the case says so. Ratios are after/before per case, from the same run.

Run: `python -m benchmarks.systems.hostile_intake --code before=DIR --code after=.`; writes
benchmarks/results/systems/hostile_intake.json and .png.
"""

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

from surge.cli import serve_process

BODY_BYTES = 300 * 10**6
PROMPT_BYTES = 8 * 10**6
PREFIX = b'{"model": "surge-tiny", "max_tokens": 1, "prompt": "'
SUFFIX = b'"}'
CASES = ("body300_declared", "body300_chunked", "prompt8mb")


def body_chunks(total: int) -> Iterator[bytes]:
    """A JSON body of exactly `total` bytes, streamed 1 MB at a time (never held whole)."""
    yield PREFIX
    left = total - len(PREFIX) - len(SUFFIX)
    piece = b"hello " * ((1 << 20) // 6)
    while left > 0:
        yield piece[:left]
        left -= min(left, len(piece))
    yield SUFFIX


def start(code: Path, home: Path, state: Path) -> tuple[subprocess.Popen, str]:
    """`surge serve` of the code at `code` (one node), in a session of its own (`stop` kills
    the session when the RSS cap killed the controller); its process and URL."""
    env = {**os.environ, "SURGE_HOME": str(home), "PYTHONPATH": str(code)}
    args = ["--nodes", "1", "--port", "0", "--state-dir", str(state)]
    proc, ready = serve_process.start_serve(
        args, state / "serve.log", env=env, cwd=code, own_session=True, timeout_s=600
    )
    return proc, ready["url"]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    else:  # killed at the cap: its agents are in its session
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


class Sampler(threading.Thread):
    """Polls /health (its latency) and the controller's RSS until told to stop; kills the
    controller's session when its RSS passes the cap."""

    def __init__(self, url: str, proc: subprocess.Popen, cap_bytes: int) -> None:
        super().__init__(daemon=True)
        self.url, self.proc, self.cap = url, proc, cap_bytes
        self.health_s: list[float] = []
        self.rss: list[int] = []
        self.capped = False
        self.halt = threading.Event()

    def run(self) -> None:
        ps = psutil.Process(self.proc.pid)
        with httpx.Client(timeout=60) as c:
            while not self.halt.is_set():
                try:
                    self.rss.append(ps.memory_info().rss)
                except psutil.Error:
                    return
                if self.rss[-1] > self.cap:
                    self.capped = True
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    return
                t0 = time.perf_counter()
                try:
                    c.get(self.url + "/health")
                    self.health_s.append(time.perf_counter() - t0)
                except httpx.HTTPError:
                    return
                self.halt.wait(0.02)


def send(url: str, case: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    headers = {"Content-Type": "application/json"}
    try:
        with httpx.Client(timeout=600) as c:
            if case == "prompt8mb":
                text = "hello " * (PROMPT_BYTES // 6)
                r = c.post(url + "/v1/completions", json={"model": "surge-tiny", "prompt": text})
            else:
                if case == "body300_declared":
                    headers["Content-Length"] = str(BODY_BYTES)
                r = c.post(url + "/v1/completions", content=body_chunks(BODY_BYTES),
                           headers=headers)  # fmt: skip
        answer = f"{r.status_code} {r.json()['error']['message'][:120] if r.is_error else 'ok'}"
    except httpx.HTTPError as e:
        answer = f"no answer: {type(e).__name__}"
    return answer, time.perf_counter() - t0


def run_case(code: Path, home: Path, case: str, cap_bytes: int) -> dict:
    with tempfile.TemporaryDirectory() as state:
        proc, url = start(code, home, Path(state))
        try:
            time.sleep(1.0)
            idle = psutil.Process(proc.pid).memory_info().rss
            sampler = Sampler(url, proc, cap_bytes)
            sampler.start()
            answer, seconds = send(url, case)
            time.sleep(0.5)
            sampler.halt.set()
            sampler.join(120)
        finally:
            stop(proc)
    h = sampler.health_s or [float("nan")]
    return {
        "answer": answer,
        "answer_s": round(seconds, 3),
        "killed_at_rss_cap": sampler.capped,
        "idle_rss_mb": round(idle / 1e6, 1),
        "peak_rss_mb": round(max(sampler.rss, default=idle) / 1e6, 1),
        "health_max_ms": round(max(h) * 1e3, 1),
        "health_p50_ms": round(statistics.median(h) * 1e3, 1),
        "health_samples": len(sampler.health_s),
    }


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "peak_rss_mb", "controller peak RSS (MB)"),
                           (axes[1], "health_max_ms", "worst /health latency (ms)")):  # fmt: skip
        width = 0.8 / len(labels)
        for i, label in enumerate(labels):
            vals = [results[label][c][key] for c in CASES]
            ax.bar([j + i * width for j in range(len(CASES))], vals, width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(CASES))], CASES)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend()
    fig.suptitle("one hostile request to `surge serve --nodes 1` (2-core CPU machine)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", action="append", default=[], help="LABEL=DIR of a surge tree")
    ap.add_argument("--rss-cap-gb", type=float, default=3.0)
    ap.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/systems/hostile_intake.json")
    )
    args = ap.parse_args()
    codes = dict(c.split("=", 1) for c in args.code) or {"after": "."}
    cap = int(args.rss_cap_gb * 1e9)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as home:
        for label, code in codes.items():
            results[label] = {c: run_case(Path(code).resolve(), Path(home), c, cap) for c in CASES}
            print(label, json.dumps(results[label], indent=1), flush=True)
    out = {
        "conditions": {
            "server": "surge serve --nodes 1, default settings, default tiny model",
            "cpus": os.cpu_count(),
            "rss_cap_gb": args.rss_cap_gb,
            "body_bytes": BODY_BYTES,
            "prompt_bytes": PROMPT_BYTES,
            "codes": codes,
        },
        "results": results,
    }
    if "before" in results and "after" in results:
        out["ratio_after_over_before"] = {
            c: {k: round(results["after"][c][k] / max(results["before"][c][k], 1e-9), 4)
                for k in ("peak_rss_mb", "health_max_ms")}
            for c in CASES
        }  # fmt: skip
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    plot(results, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
