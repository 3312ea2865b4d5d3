"""Soak under chaos (issue 36): an Azure trace replayed against `surge serve` while agents are
killed and frozen and clients vanish; memory, files, threads and /dev/shm must stay flat and
every request must end answered or with an error.

What runs: `surge serve --nodes N` (default settings otherwise, the tiny model by name) and
this module's own asyncio client (httpx): the Azure LLM 2023 conversation trace
(`../shared/traces`) from its start, arrivals scaled to `--rate` requests/s, prompts as token
ids of the trace's lengths (clipped to 256), `max_tokens` its output length (clipped to 64);
half streamed; `--vanish` of them hang up after 0.2-1.0 s. Every `--chaos-period-s` one
agent is hit, alternately SIGKILL and SIGSTOP (left frozen: the heartbeat must find it; the
controller replaces both). Every 2 s: the controller's and the agents' RSS, open file
descriptors and threads, and the surge segments in /dev/shm.

Outcomes per request: `ok` (200, complete), `error` (a 4xx/5xx or an SSE error event, with
its message), `vanished` (the client hung up on purpose), `lost` (no answer and no error: a
reset, a stream cut without `[DONE]`, a timeout) — which must be 0. Growth is the mean of
the last fifth of the run minus the mean of the fifth after warm-up (the first fifth).

Run: `python -m benchmarks.systems.soak [--minutes 30 --rate 2 --nodes 3]`; writes
benchmarks/results/systems/soak.json and .png.
"""

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from surge.cli import serve_process
from surge.traces.resolve import load_trace

MODEL = "surge-tiny"
VOCAB = 1024
OUT = Path("benchmarks/results/systems/soak.json")


def start_serve(state: Path, nodes: int) -> tuple[subprocess.Popen, str]:
    from surge.model.default_store import default_store

    # The tiny model by name: the default model is SmolLM2 where setup imported it.
    args = ["--nodes", str(nodes), "--port", "0", "--model", str(default_store()),
            "--name", MODEL, "--state-dir", str(state)]  # fmt: skip
    proc, ready = serve_process.start_serve(args, state / "serve.log", timeout_s=600)
    return proc, ready["url"]


async def one(c: httpx.AsyncClient, i: int, ids: list[int], out_tokens: int, stream: bool,
              vanish: bool, outcomes: dict[str, int], errors: dict[str, int]) -> None:  # fmt: skip
    body = {"model": MODEL, "prompt": ids, "max_tokens": out_tokens, "stream": stream,
            "ignore_eos": True}  # fmt: skip

    async def call() -> str:
        if not stream:
            r = await c.post("/v1/completions", json=body)
            if r.status_code != 200:
                msg = r.json()["error"]["message"][:80]
                errors[msg] = errors.get(msg, 0) + 1
                return "error"
            return "ok" if r.json()["choices"][0]["finish_reason"] == "length" else "lost"
        async with c.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                msg = r.json()["error"]["message"][:80]
                errors[msg] = errors.get(msg, 0) + 1
                return "error"
            last = ""
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    if '"error"' in line:
                        msg = json.loads(line[6:])["error"]["message"][:80]
                        errors[msg] = errors.get(msg, 0) + 1
                        return "error"
                    last = line
            return "ok" if last == "data: [DONE]" else "lost"

    try:
        if vanish:
            try:
                await asyncio.wait_for(call(), random.uniform(0.2, 1.0))
                kind = "ok"
            except TimeoutError:
                kind = "vanished"
        else:
            kind = await asyncio.wait_for(call(), 300)
    except Exception as e:  # a reset or a timeout: no answer and no error
        kind = "lost"
        errors[f"lost: {type(e).__name__}"] = errors.get(f"lost: {type(e).__name__}", 0) + 1
    outcomes[kind] += 1


def sample(serve: psutil.Process, t0: float) -> dict[str, Any]:
    def is_agent(p: psutil.Process) -> bool:
        with contextlib.suppress(psutil.Error):  # a killed agent is a zombie until reaped
            return p.status() != psutil.STATUS_ZOMBIE and "node" in " ".join(p.cmdline())
        return False

    agents = [p for p in serve.children(recursive=True) if is_agent(p)]

    def total(f) -> float:
        out = 0.0
        for p in agents:
            with contextlib.suppress(psutil.Error):
                out += f(p)
        return out

    shm = [f for f in Path("/dev/shm").glob("surge_*")]
    return {
        "t_s": round(time.monotonic() - t0, 1),
        "controller_rss_mb": round(serve.memory_info().rss / 1e6, 1),
        "controller_fds": serve.num_fds(),
        "controller_threads": serve.num_threads(),
        "agents": len(agents),
        "agents_rss_mb": round(total(lambda p: p.memory_info().rss) / 1e6, 1),
        "agents_fds": int(total(lambda p: p.num_fds())),
        "agents_threads": int(total(lambda p: p.num_threads())),
        "shm_segments": len(shm),
        "shm_mb": round(sum(f.stat().st_size for f in shm if f.exists()) / 1e6, 1),
    }


async def chaos(url: str, period_s: float, end: float, log: list[dict[str, Any]], t0: float):
    kinds = ["kill", "freeze"]
    k = 0
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        while time.monotonic() + period_s < end:
            await asyncio.sleep(period_s)
            nodes = [n for n in (await c.get("/v1/nodes")).json()["data"] if n["up"] and n["pid"]]
            if not nodes:
                continue
            victim = random.choice(nodes)
            kind = kinds[k % 2]
            k += 1
            os.kill(victim["pid"], signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            log.append({"t_s": round(time.monotonic() - t0, 1), "fault": kind,
                        "node": victim["node"], "pid": victim["pid"]})  # fmt: skip


async def run(args: argparse.Namespace, url: str, serve: psutil.Process) -> dict[str, Any]:
    trace = load_trace("azure-conv", 0, None)
    n_req = min(trace.num_requests, 2000)
    arrivals = [float(a) - float(trace.arrival_s[0]) for a in trace.arrival_s[:n_req]]
    ins, outs = trace.input_tokens[:n_req], trace.output_tokens[:n_req]
    span = arrivals[-1] + arrivals[-1] / n_req
    real_per_trace_s = (n_req / span) / args.rate  # compresses (or stretches) the trace
    rng = random.Random(0)
    outcomes = {"ok": 0, "error": 0, "vanished": 0, "lost": 0}
    errors: dict[str, int] = {}
    samples: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    chaos_task = asyncio.ensure_future(chaos(url, args.chaos_period_s, end, faults, t0))
    tasks = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=50)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as c:
        i = 0
        next_sample = t0
        while time.monotonic() < end:
            j = i % n_req
            due = t0 + (arrivals[j] + (i // n_req) * span) * real_per_trace_s
            now = time.monotonic()
            if now >= next_sample:
                samples.append(await asyncio.to_thread(sample, serve, t0))
                next_sample = now + 2.0
            if due > now:
                await asyncio.sleep(min(due - now, max(0.0, next_sample - now)))
                continue
            ids = [rng.randrange(2, VOCAB) for _ in range(max(1, min(int(ins[j]), 256)))]
            out = max(1, min(int(outs[j]), 64))
            tasks.append(asyncio.ensure_future(one(
                c, i, ids, out, rng.random() < 0.5, rng.random() < args.vanish, outcomes, errors
            )))  # fmt: skip
            i += 1
        chaos_task.cancel()
        await asyncio.gather(*tasks)
    for _ in range(5):  # the last faults' replacements settle
        await asyncio.sleep(2)
        samples.append(await asyncio.to_thread(sample, serve, t0))
    return {"outcomes": outcomes, "errors": errors, "samples": samples, "faults": faults,
            "requests": i}  # fmt: skip


def growth(samples: list[dict[str, Any]]) -> dict[str, float]:
    n = len(samples)
    early, late = samples[n // 5 : 2 * n // 5], samples[4 * n // 5 :]
    keys = [k for k in samples[0] if k not in ("t_s",)]
    return {k: round(statistics.mean(s[k] for s in late) - statistics.mean(s[k] for s in early), 1)
            for k in keys}  # fmt: skip


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["samples"]
    t = [x["t_s"] / 60 for x in s]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    axes[0].plot(t, [x["controller_rss_mb"] for x in s], label="controller")
    axes[0].plot(t, [x["agents_rss_mb"] for x in s], label="agents (sum)")
    axes[0].set_title("RSS (MB)")
    axes[1].plot(t, [x["controller_fds"] for x in s], label="controller fds")
    axes[1].plot(t, [x["agents_fds"] for x in s], label="agents fds")
    axes[1].plot(t, [x["controller_threads"] for x in s], label="controller threads")
    axes[1].set_title("open files, threads")
    axes[2].plot(t, [x["shm_mb"] for x in s], label="/dev/shm MB")
    axes[2].plot(t, [x["shm_segments"] for x in s], label="segments")
    axes[2].set_title("/dev/shm")
    for ax in axes:
        for f in result["faults"]:
            ax.axvline(f["t_s"] / 60, color="red" if f["fault"] == "kill" else "blue", alpha=0.3)
        ax.set_xlabel("minutes (red: kill, blue: freeze)")
        ax.legend(fontsize=7)
    fig.suptitle(f"soak: {result['conditions']['minutes']} min, outcomes {result['outcomes']}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=2.0, help="requests/s")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--chaos-period-s", type=float, default=60.0)
    ap.add_argument("--vanish", type=float, default=0.1, help="share of clients that hang up")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    random.seed(0)
    with tempfile.TemporaryDirectory() as state:
        proc, url = start_serve(Path(state), args.nodes)
        try:
            result = asyncio.run(run(args, url, psutil.Process(proc.pid)))
            health = httpx.get(url + "/health").json()
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        log = (Path(state) / "serve.log").read_text()
    result["conditions"] = {
        **vars(args),
        "out": str(args.out),
        "cpus": os.cpu_count(),
        "client": "this module (httpx, asyncio)",
        "trace": "azure-conv",
    }
    result["growth_after_warmup"] = growth(result["samples"])
    result["health_at_end"] = health
    result["log_tracebacks"] = log.count("Traceback")
    result["log_lines"] = len(log.splitlines())
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out.with_suffix(".png"))
    keys = ("outcomes", "errors", "growth_after_warmup", "health_at_end", "log_tracebacks")
    print(json.dumps({k: result[k] for k in keys}, indent=1))


if __name__ == "__main__":
    main()
