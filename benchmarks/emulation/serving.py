"""The real controller on an emulated cluster: a workload replayed in emulated time, per system.

Shared by the emulated system benchmarks (`blitzscale.py`, `flexpipe.py`). One cluster of
agents emulating PRESET:MODEL serves every system in turn (the deployment's copies are
deleted after each system, and the scenario's disk and host copies staged before the next
one: `staging.fresh_copies`), each system behind a fresh `Controller` whose clock is the
emulation's (`control/emulation.control_clock`: its autoscaler, keep-alives and SLOs act in
emulated seconds). Requests are submitted at their emulated arrival times on that clock;
TTFT and TBT are the controller's own request stamps, so every time here is emulated seconds.
What the benchmarks share besides: `start_logging`, and `staging.py` (the real small model in
a temporary directory, the agents and their copies before each system's run); their result
files are `report.py`'s; each run's scale-outs are read back by `timeline.py`.
"""

import asyncio
import contextlib
import faulthandler
import itertools
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from benchmarks.common import code_version
from benchmarks.emulation.agents import violations
from benchmarks.emulation.timeline import (
    mechanism_timeline,
    request_timeline,
    scale_out_timeline,
)
from surge.control.controller import Controller, ControllerConfig
from surge.control.state import Deployment
from surge.emulation import Emulation
from surge.engine.sampling import SamplingParams
from surge.events import InstanceUp, Load, TimelineEvent
from surge.policy.systems import SYSTEMS, SystemConfig
from surge.runtime.launch.local import LocalCluster

log = logging.getLogger("emulation_serving")

READY_TIMEOUT_S = 3600.0
"""Real seconds the first instances may take to serve (loads at D = 80 take minutes)."""
DONE_TIMEOUT_S = 5400.0
"""Real seconds the workload may take to finish."""


@dataclass(frozen=True)
class Workload:
    """Requests in emulated seconds from the start of the replay."""

    arrival_s: tuple[float, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)


@contextlib.contextmanager
def registered(variants: dict[str, SystemConfig]) -> Iterator[None]:
    """Each variant servable by `surge serve` for the run, as the strategy its key names (a
    figure's counterfactual or ablation step of a shipped system: the controller reads a
    deployment's system by its strategy, `DeploymentSpec.system`); taken out after it. The
    shipped systems are left as they are."""
    if clash := set(variants) & set(SYSTEMS):
        raise ValueError(f"{sorted(clash)} name shipped systems; register variants by new names")
    with mock.patch.dict(SYSTEMS, {k: replace(v, serve=True) for k, v in variants.items()}):
        yield


def percentile(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 4) if xs else None


def start_logging() -> None:
    """INFO logs with times; `kill -USR1 PID` prints every thread's stack (a run that
    seems stuck at D = 80 is usually only slow)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    faulthandler.register(signal.SIGUSR1)


async def counts(cluster: LocalCluster) -> dict[int, tuple[int, int]]:
    """Each agent's paced steps and violations so far."""
    return {n: (s[0], s[1]) for n, s in (await violations(cluster)).items()}


async def next_tick_s(events: asyncio.Queue, clock_s: Callable[[float], float]) -> float:
    """When the autoscaler ticks next (its `Load` event; `clock_s` maps a bus stamp to the
    serving clock): the replay's zero. The simulator decides at multiples of the tick from
    its trace's zero (`sim/scaling.Scaler.check_soon`); the controller ticks every `tick_s`
    from its own start, so a replay started at any instant put every decision a random
    0-0.1 s later than the simulator's, for no reason of either body (§6.1's first
    scale-out: 1.059 vs 1.0 s). Aligned, both decide at the same instants."""
    while not isinstance(ev := await events.get(), Load):
        pass
    return clock_s(ev.t_s)


async def serve_workload(
    cluster: LocalCluster,
    state: Path,
    emulation: Emulation,
    spec: dict[str, Any],
    workload: Workload,
    ready: int,
    controller: dict[str, Any],
    drain_s: float | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    at_start: Callable[[Deployment], None] | None = None,
    stop: Callable[[Deployment, float], bool] | None = None,
) -> dict[str, Any]:
    """Deploy `spec` behind a fresh controller on `cluster`, wait for `ready` serving
    instances, replay `workload` on the controller's (emulated) clock and report what the
    requests and the controller saw, in emulated seconds. `on_result` gets it before the
    deployment is deleted: the deletion waits for loads still in flight (a ServerlessLLM SSD
    load outlasts the burst by minutes at D = 40), and a sitting cut off then keeps it.
    `at_start(dep)` runs at the replay's zero (a microbenchmark's scale-out asked for then);
    `stop(dep, now_s)` (emulated s from that zero), asked before each submission and every
    0.2 real s after, ends the replay once true: requests not done then are cut off."""
    cfg = ControllerConfig(
        state_dir=state, nodes=len(cluster.addresses), emulation=emulation, **controller
    )
    ctl = Controller(cfg, cluster.addresses, cluster.token)
    await ctl.start()
    seen = ctl.events.subscribe()  # scale-outs, blocks landing, instances up
    try:
        dep = await ctl.create(spec)
        t0 = time.monotonic()
        while len(dep.serving()) < ready or dep.multicasting:
            if time.monotonic() - t0 > READY_TIMEOUT_S:
                raise RuntimeError(f"{spec['strategy']}: {ready} first instances never served")
            await asyncio.sleep(0.2)
        log.info("%s: %d instances serve after %.0f real s", spec["strategy"], ready,
                 time.monotonic() - t0)  # fmt: skip
        setup_real_s = time.monotonic() - t0
        clock = ctl.clock
        before = await counts(cluster)
        held: list[tuple[float, int]] = []
        egress: list[tuple[float, dict[int, int]]] = []
        while not seen.queue.empty():  # what happened before the replay
            seen.queue.get_nowait()
        start = await next_tick_s(seen.queue, lambda t: clock.of_real(ctl.events.t0 + t))
        real0 = time.monotonic()

        events: list[TimelineEvent] = []

        async def sample() -> None:
            while True:
                while not seen.queue.empty():  # kept here: the bus's queue is bounded
                    events.append(seen.queue.get_nowait())
                held.append((clock.now_s() - start, len(dep.instances)))
                if dep.server.pd is not None:
                    egress.append((clock.now_s() - start, dep.server.pd.egress_handoffs()))
                await clock.sleep(0.05)

        sampler = asyncio.get_running_loop().create_task(sample())
        rng = np.random.default_rng(0)
        reqs = []
        if at_start is not None:
            at_start(dep)

        def stopped() -> bool:
            return stop is not None and stop(dep, clock.now_s() - start)

        for at_s, prompt, out in zip(
            workload.arrival_s, workload.prompt_tokens, workload.output_tokens, strict=True
        ):
            if stopped():
                break
            delay = start + at_s - clock.now_s()
            if delay > 0:
                await clock.sleep(delay)
            ids = [int(x) for x in rng.integers(2, 500, prompt)]
            params = SamplingParams(max_tokens=out, ignore_eos=True)
            reqs.append(await ctl.submit(dep, ids, params))
        log.info("%s: %d requests submitted; waiting for them", spec["strategy"], len(reqs))
        waits = asyncio.gather(*(r.done.wait() for r in reqs))
        if stop is not None:
            while not stopped() and not all(r.done.is_set() for r in reqs):
                await asyncio.sleep(0.2)
            waits.cancel()  # the requests cut off: their waits go quietly
            with contextlib.suppress(asyncio.CancelledError):
                await waits
        elif drain_s is None:
            await asyncio.wait_for(waits, DONE_TIMEOUT_S)
        else:  # every TTFT, then `drain_s` emulated s of decoding; the rest is cut off
            t0 = time.monotonic()
            while any(r.first_token_t is None and not r.done.is_set() for r in reqs):
                if time.monotonic() - t0 > DONE_TIMEOUT_S:
                    raise RuntimeError(f"{spec['strategy']}: requests never got a first token")
                await asyncio.sleep(0.2)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waits, clock.real_s(drain_s))
        sampler.cancel()
        after = await counts(cluster)
        end_s = max(r.done_t or clock.now_s() for r in reqs) - start
        ttft = [r.first_token_t - r.arrival_t for r in reqs if r.first_token_t is not None]
        tbt = [b - a for r in reqs for a, b in itertools.pairwise(r.token_times)]
        e2e = [r.done_t - r.arrival_t for r in reqs if r.done_t is not None and not r.error]
        gpu_s = sum(0.05 * n for t, n in held if t <= end_s)
        status = ctl.describe(dep)["status"]
        pd = dep.server.pd
        m = ctl.metrics
        events += [seen.queue.get_nowait() for _ in range(seen.queue.qsize())]
        bus_t0 = ctl.events.t0

        def emulated_s(t_s: float) -> float:
            return clock.of_real(bus_t0 + t_s) - start

        timeline = scale_out_timeline(events, emulated_s, egress)
        scale_outs = {
            s.labels["start"]: s.value
            for metric in m.scale_outs.collect()
            for s in metric.samples
            if s.name.endswith("_total") and s.labels.get("model") == spec["name"]
        }
        steps = sum(after[n][0] - before[n][0] for n in after)
        bad = sum(after[n][1] - before[n][1] for n in after)
        result = {
            "strategy": spec["strategy"],
            "requests": len(reqs),
            "finished": sum(r.done.is_set() for r in reqs),
            "failed": sum(r.finish_reason == "error" for r in reqs),
            "ttft_mean_s": round(float(np.mean(ttft)), 4) if ttft else None,
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p90_s": percentile(ttft, 90),
            "ttft_p99_s": percentile(ttft, 99),
            "e2e_mean_s": round(float(np.mean(e2e)), 4) if e2e else None,
            "e2e_p50_s": percentile(e2e, 50),
            "e2e_p99_s": percentile(e2e, 99),
            "tbt_mean_s": round(float(np.mean(tbt)), 5) if tbt else None,
            "tbt_p50_s": percentile(tbt, 50),
            "tbt_p99_s": percentile(tbt, 99),
            "gpu_s": round(gpu_s, 3),
            "all_done_s": round(end_s, 3),
            "max_instances": max((n for _, n in held), default=0),
            "scale_outs": scale_outs,
            "live_prefilled": status.get("live_prefilled", 0),
            "handoffs": pd.num_handoffs if pd else 0,
            "mutations": pd.num_mutations if pd else 0,
            "flexpipe": status.get("flexpipe"),
            "ttfts_s": sorted(round(x, 4) for x in ttft),
            "instances_timeline": [[round(t, 3), n] for t, n in held[:: max(1, len(held) // 200)]],
            "scale_out_timeline": timeline,
            # every local instance that came up during the replay: [when, node]
            "instances_up": [
                [round(emulated_s(ev.t_s), 3), ev.node]
                for ev in events
                if isinstance(ev, InstanceUp) and emulated_s(ev.t_s) >= 0
            ],
            "request_timeline": request_timeline(reqs, start),
            "mechanisms": mechanism_timeline(events, emulated_s),
            "peak_handoffs_in_flight": pd.peak_in_flight if pd else 0,
            "emulation": {
                "steps": steps,
                "violations": bad,
                "violation_rate": round(bad / steps, 4) if steps else None,
            },
            "setup_real_s": round(setup_real_s, 1),
            "replay_real_s": round(time.monotonic() - real0, 1),
            "load_average": os.getloadavg(),
            "code": code_version(),
        }
        if on_result is not None:
            on_result(result)
        return result
    finally:
        with contextlib.suppress(
            Exception
        ):  # instances and copies go: the next system starts clean
            await ctl.delete(spec["name"])
        ctl.events.unsubscribe(seen)
        await ctl.stop()
