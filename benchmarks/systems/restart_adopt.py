"""Controller restart: time to the first token when the new controller adopts the old one's
instances, against closing them and starting them again (main before adoption).

What runs: `--nodes` loopback agents this script owns (`LocalCluster`, default engine
settings) and `surge serve --launcher static` joining them, every other setting its default
(the default model: SmolLM2-135M-Instruct where setup imported it, else the tiny model; the
`lambdascale` strategy, `downscale_delay_s` 10 s). One `surge serve` deploys the model and
serves a request; then, trial after trial: a long request (256 tokens, streamed) is sent and,
1.2 s after its first token (the autoscaler state is written every second), the server is
SIGKILLed while it streams (a crash: the request is lost with its connection; the agents keep
the instance), and a new `surge serve` starts on the same state directory:
- `adopt`: as it is; the new controller adopts the instance (`policy/adoption.py`);
- `close`: the script first does what main's restore did before adoption: `instance_close`
  and `evict` (gpu tier; host and disk copies stay) on every agent holding the model in its
  GPU tier; the new controller starts the carried instance again (warm: the pinned host copy).
With `--case pipeline`, what the crash leaves is a λScale execution pipeline (§4.3: one caught
mid scale-out): after the kill the script closes what runs of the model and opens a two-stage
pipeline over nodes 0 and 1, each holding on the device only its stage's blocks (the rest
evicted, the missing ones pulled from the store; the others' device copies evicted); `adopt`
leaves it (the new controller adopts it whole, `policy/pipeline_adoption.py`), `close` then
closes its stages and evicts their device copies, as main before pipeline adoption did. The
deployment (the default model, named so in a config file) then keeps an idle instance 60 s
(`downscale_delay_s`, `keep_alive_s`), not 10: the script's set-up after the kill (seconds
under load) must not count against the adopted pipeline's idle time.
Measured from the new process's start: its ready line, and the first streamed token of a
request sent at once after it (greedy, 16 tokens; `--temperature T`: sampled at T, as the
API's default request is at 1, and written to `..._sampled.json`: an adopted pipeline's
last stage picks the tokens, so its head engines serve either without torch in the
controller). Trials alternate close, adopt. That server
is the next trial's old one. A restart slower than the keep-alive (10 s from the last request
before the crash) finds the adopted instance released, as the old controller would have
released it, and starts one again: such a trial is kept, `adopted: false`. Every process is
stopped by its PID at the end.

Run: `python -m benchmarks.systems.restart_adopt [--trials 3 --nodes 2 --case local]`; writes
benchmarks/results/systems/restart_adopt.json (`--case pipeline`: restart_adopt_pipeline.json).
"""

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from surge.cli import serve_process
from surge.model.default_store import default_model
from surge.model.manifest import read_manifest
from surge.policy.pipeline_adoption import stage_blocks
from surge.runtime.client import ClusterClient
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.protocol import (
    EvictOp,
    InstanceCloseOp,
    LoadOp,
    StageCloseOp,
    StageOpenOp,
    StatusOp,
)
from surge.runtime.scaleout.context import pipeline_name

OUT = {
    "local": Path("benchmarks/results/systems/restart_adopt.json"),
    "pipeline": Path("benchmarks/results/systems/restart_adopt_pipeline.json"),
}
PROMPT = "The capital of France is"


def start(state: Path, static: list[str]) -> tuple[subprocess.Popen, str, float]:
    """A `surge serve` on `state` joining the agents; (process, url, seconds to ready)."""
    t0 = time.monotonic()
    args = ["--port", "0", "--state-dir", str(state), *static]
    if (state.parent / "serve.yaml").is_file():
        args += ["--config", str(state.parent / "serve.yaml")]
    proc, ready = serve_process.start_serve(args, state / "serve.log", timeout_s=600)
    return proc, ready["url"], time.monotonic() - t0


def first_token_s(url: str, model: str, temperature: float = 0.0) -> float:
    """Seconds to the first streamed token of a request (greedy unless `temperature`; the
    stream read to its end)."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": temperature,
            "stream": True}  # fmt: skip
    t0 = time.monotonic()
    first = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                first = time.monotonic() - t0
    assert first is not None, "no token"
    return first


def in_flight(url: str, model: str, started: threading.Event) -> None:
    """A long stream in flight when the controller is killed (lost with it)."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 256, "temperature": 0,
            "stream": True}  # fmt: skip
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
            for _ in r.iter_lines():
                started.set()
    except httpx.HTTPError:
        pass  # the connection ended with the controller
    started.set()


async def close_like_main(cluster: LocalCluster, model: str, evict: bool = True) -> int:
    """What main's restore did to an old controller's instances and pipeline stages: close
    them, evict the GPU copy (`evict`). How many nodes held one."""
    client = ClusterClient(cluster.addresses, cluster.token)
    await client.connect()
    try:
        statuses = await client.broadcast(StatusOp())
        for node, s in statuses.items():
            for r in s.running:
                if r.model == model and r.kind == "stage":
                    await client.call(node, StageCloseOp(pipeline=r.name))
                elif r.model == model:
                    await client.call(node, InstanceCloseOp(instance=r.name))
        held = {n: s.models[model].gpu for n, s in statuses.items()
                if model in s.models and s.models[model].gpu}  # fmt: skip
        for node, blocks in held.items() if evict else ():
            await client.call(node, EvictOp(model=model, blocks=blocks, tier="gpu"))
        return len(held)
    finally:
        await client.close()


async def leave_pipeline(cluster: LocalCluster, registry: Path, model: str, trial: int) -> None:
    """What a crash mid-multicast leaves (module docstring): a two-stage pipeline over nodes
    0 and 1, each with only its stage's blocks on the device."""
    await close_like_main(cluster, model, evict=False)
    m = read_manifest(registry / model)
    layers = [(b.first_layer, b.end_layer) for b in m.blocks]
    h, end = m.blocks[m.num_blocks // 2].first_layer, m.arch.num_layers
    want = {0: set(stage_blocks(layers, 0, h)), 1: set(stage_blocks(layers, h, end))}
    name = pipeline_name(model, f"crash{trial}", 0)
    client = ClusterClient(cluster.addresses, cluster.token)
    await client.connect()
    try:
        for node, s in (await client.broadcast(StatusOp())).items():
            held = set(s.models[model].gpu) if model in s.models else set()
            extra, missing = held - want.get(node, set()), want.get(node, set()) - held
            if extra:
                await client.call(node, EvictOp(model=model, blocks=tuple(sorted(extra)),
                                                tier="gpu"))  # fmt: skip
            if missing:
                await client.call(node, LoadOp(model=model, blocks=tuple(sorted(missing)),
                                               source="remote", tier="gpu"))  # fmt: skip
        await client.call(1, StageOpenOp(pipeline=name, model=model, first_layer=h,
                                         end_layer=end))  # fmt: skip
        await client.call(0, StageOpenOp(pipeline=name, model=model, first_layer=0,
                                         end_layer=h, next_node=1))  # fmt: skip
    finally:
        await client.close()


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3, help="trials of each mode")
    ap.add_argument("--nodes", type=int, default=2)
    what = "what the crash leaves: a local instance, or a λScale pipeline"
    ap.add_argument("--case", choices=sorted(OUT), default="local", help=what)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="of the request timed after the restart (0: greedy)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.case == "pipeline" and a.nodes < 2:
        ap.error("--case pipeline needs 2 nodes at least")
    trials: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        (state / "registry").mkdir(parents=True)
        cluster = LocalCluster(LocalClusterConfig(num_nodes=a.nodes, remote_dir=state / "registry"))
        if a.case == "pipeline":
            store, served = default_model()
            kept = {"downscale_delay_s": 60, "keep_alive_s": 60}
            deployment = {"name": served, "model": str(store), "autoscaling": kept}
            (Path(tmp) / "serve.yaml").write_text(json.dumps({"deployments": [deployment]}))
        with cluster:
            token = Path(tmp) / "token"
            token.write_text(cluster.token + "\n")
            agents = ",".join(f"{h}:{p}" for h, p in cluster.addresses.values())
            static = ["--launcher", "static", "--agents", agents, "--token-file", str(token)]
            proc, url, _ = start(state, static)
            try:
                model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
                first_token_s(url, model)  # deployed, an instance serving
                for i in range(2 * a.trials):
                    mode = "close" if i % 2 == 0 else "adopt"
                    started = threading.Event()
                    crashed = threading.Thread(target=in_flight, args=(url, model, started))
                    crashed.start()
                    assert started.wait(600), "the in-flight request never streamed"
                    time.sleep(1.2)  # the autoscaler state is written every second
                    kill(proc)
                    crashed.join(60)
                    if a.case == "pipeline":
                        asyncio.run(leave_pipeline(cluster, state / "registry", model, i))
                    closed = asyncio.run(close_like_main(cluster, model)) if mode == "close" else 0
                    proc, url, ready_s = start(state, static)
                    after_ready_s = first_token_s(url, model, a.temperature)
                    total_s = ready_s + after_ready_s  # the request goes at once after ready
                    status = httpx.get(url + f"/v1/deployments/{model}").json()["status"]
                    trials.append({"mode": mode, "closed_by_script": closed,
                                   "ready_s": round(ready_s, 3),
                                   "ttft_after_ready_s": round(after_ready_s, 3),
                                   "restart_to_first_token_s": round(total_s, 3),
                                   "scale_outs": status["scale_outs"],
                                   "adopted": status["scale_outs"] == 0})  # fmt: skip
                    print(json.dumps(trials[-1]), flush=True)
            finally:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    kill(proc)
    med = {
        m: {k: statistics.median(t[k] for t in trials if t["mode"] == m)
            for k in ("ready_s", "ttft_after_ready_s", "restart_to_first_token_s")}
        for m in ("adopt", "close")
    }  # fmt: skip
    out = {
        "model": model,
        "case": a.case,
        "nodes": a.nodes,
        "temperature": a.temperature,
        "trials": trials,
        "median": med,
        "ratio_close_over_adopt": {
            k: round(med["close"][k] / med["adopt"][k], 2)
            for k in ("ttft_after_ready_s", "restart_to_first_token_s")
        },
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
    }
    path = a.out or OUT[a.case]
    if a.out is None and a.temperature > 0:
        path = path.with_name(path.stem + "_sampled.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["median"]), json.dumps(out["ratio_close_over_adopt"]))


if __name__ == "__main__":
    main()
