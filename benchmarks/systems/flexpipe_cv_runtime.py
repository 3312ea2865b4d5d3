"""The runtime half of `benchmarks/systems/flexpipe_cv.py`: FlexPipe under load variability on
`surge serve`'s controller in process with loopback agents and a tiny Llama built here.

In: the script's arguments (nodes, model size, rate, CVs, phase length, SLO). Out: per
variant (`flexpipe_sim.VARIANTS`: flexpipe, static-fine, static-coarse, load-then-serve)
a fresh cluster and one phase per CV (arrivals for `--duration` s, drained, then `--gap` s
idle); per phase the latencies, queue times, goodput, slot-seconds and refactorings the
script's docstring lists, and per CV the best static's p99 over flexpipe's.
"""

import argparse
import asyncio
import contextlib
import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.common import model_config
from benchmarks.systems.flexpipe_sim import VARIANTS
from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.model.importer import import_checkpoint
from surge.model.tiny import create_tiny_model
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.systems import SYSTEMS
from surge.runtime.migration.refactor import FlexPipeline
from surge.traces.gamma import gamma_arrivals

MODEL = "fpcv"


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def _settings(variant: str, args: argparse.Namespace) -> FlexPipeSettings:
    base = {"cv_window_s": args.cv_window, "decision_interval_s": 0.5}
    if variant == "static-fine":
        return FlexPipeSettings(stage_counts=(args.fine_stages,), cv_targets=(0.0,), **base)
    if variant == "static-coarse":
        return FlexPipeSettings(stage_counts=(1,), cv_targets=(0.0,), **base)
    return FlexPipeSettings(**base)


async def _phase(ctl, dep, args, cv: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    arrivals = gamma_arrivals(rng, args.rate, cv, args.duration)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    prompts = [list(rng.integers(1, 500, size=args.prompt_tokens)) for _ in arrivals]
    reqs, taken = [], {}
    held: list[int] = []
    start = time.monotonic()
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            held.append(len(dep.instances))
            for r in reqs:
                if id(r) not in taken and r.endpoint is not None:
                    taken[id(r)] = time.monotonic()
            await asyncio.sleep(0.01)

    watcher = asyncio.ensure_future(watch())
    for at, prompt in zip(arrivals, prompts, strict=True):
        await asyncio.sleep(max(0.0, start + float(at) - time.monotonic()))
        reqs.append(await ctl.submit(dep, [int(x) for x in prompt], params))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs)), args.drain)
    end = time.monotonic()
    stop.set()
    await watcher
    done = [r for r in reqs if r.done_t is not None and r.error is None]
    e2e = [r.done_t - r.arrival_t for r in done]
    ttft = [r.first_token_t - r.arrival_t for r in done if r.first_token_t is not None]
    queue = [taken[id(r)] - r.arrival_t for r in reqs if id(r) in taken]
    slots = np.array(held or [0])
    return {
        "requests": len(reqs),
        "finished": len(done),
        "e2e_p50_s": _pct(e2e, 50),
        "e2e_p99_s": _pct(e2e, 99),
        "queue_p50_s": _pct(queue, 50),
        "queue_p99_s": _pct(queue, 99),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p99_s": _pct(ttft, 99),
        "goodput_rps": sum(x <= args.slo_e2e for x in e2e) / (end - start),
        "gpu_seconds": float(slots.mean() * (end - start)),
        "slots_peak": int(slots.max()),
        "slots_always_held": float(np.percentile(slots, 10)),
    }


async def _variant(variant: str, store: Path, state: Path, args: argparse.Namespace) -> dict:
    # One set of FlexPipe settings, read by the controller and the scale-out alike
    # (`SystemConfig.flexpipe`): the static variants hold the system at one granularity.
    original = SYSTEMS["flexpipe"]
    SYSTEMS["flexpipe"] = replace(original, flexpipe=_settings(variant, args))
    cfg = ControllerConfig(state_dir=state, nodes=args.nodes, max_num_seqs=args.max_num_seqs)
    ctl = Controller(cfg)
    await ctl.start()
    out: dict = {}
    try:
        strategy = "serverlessllm" if variant == "load-then-serve" else "flexpipe"
        body = {
            "name": MODEL,
            "model": str(store),
            "strategy": strategy,
            "autoscaling": {
                "min_replicas": 1,
                "max_replicas": args.nodes,
                "target_ongoing_requests": args.target_ongoing,
                "downscale_delay_s": 3,
                "keep_alive_s": 60,
            },
        }
        dep = await ctl.create(body)
        deadline = time.monotonic() + 120
        while not dep.server.endpoints and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for i, cv in enumerate(args.cvs):
            before = dict(dep.flexpipe.refactors) if dep.flexpipe else {}
            row = await _phase(ctl, dep, args, cv, seed=100 + i)
            after = dict(dep.flexpipe.refactors) if dep.flexpipe else {}
            row["refactors"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            row["stages_after"] = [
                len(e.stages) for e in dep.server.endpoints.values() if isinstance(e, FlexPipeline)
            ]
            out[str(cv)] = row
            logging.info("%s cv=%s: %s", variant, cv, row)
            await asyncio.sleep(args.gap)
    finally:
        await ctl.stop()
        SYSTEMS["flexpipe"] = original
    return out


def _ratios(by_variant: dict, cvs: list[str], p99_key: str, gpu_key: str) -> dict:
    out = {}
    for cv in cvs:
        fp = by_variant["flexpipe"][cv]
        statics = [by_variant[v][cv] for v in ("static-fine", "static-coarse")]
        best_p99 = min(s[p99_key] for s in statics if s[p99_key] is not None)
        best_gpu = min(s[gpu_key] for s in statics)
        out[cv] = {
            "best_static_over_flexpipe_e2e_p99": best_p99 / fp[p99_key] if fp[p99_key] else None,
            "flexpipe_over_best_static_gpu_seconds": fp[gpu_key] / best_gpu if best_gpu else None,
        }
    return out


def runtime(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        create_tiny_model(tmp / "hf", model_config(args.model_mb, args.layers))
        store = tmp / "store" / MODEL
        import_checkpoint(tmp / "hf", store, num_blocks=args.layers, progress=False)
        by_variant = {}
        for v in VARIANTS:
            by_variant[v] = asyncio.run(_variant(v, store, tmp / f"state-{v}", args))
    cvs = [str(c) for c in args.cvs]
    return {
        "by_variant": by_variant,
        "ratios": _ratios(by_variant, cvs, "e2e_p99_s", "gpu_seconds"),
    }
