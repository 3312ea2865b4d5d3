"""A blitzscale deployment's first live look does not wait for the zigzag ILP's solver import
(`runtime/scaleout/ilp_warmup.py`): creating the deployment starts it in the background.
Before, the first look imported `scipy.optimize` itself (~4 s on a loaded machine) while
the new instance's layers kept landing (`test_live_scaling.py[tight]` failed at load ~11)."""

import asyncio
import threading
import time

from surge.control.controller import Controller, ControllerConfig
from surge.policy.blitzscale import zigzag
from surge.policy.blitzscale.live_scaling import (
    LiveScalingState,
    LiveSettings,
    LiveSource,
    LiveView,
    RunBatch,
    Waiting,
)
from surge.policy.systems import system_config
from surge.runtime.scaleout.ilp_warmup import warm_solver
from tests.control.strategy_run import local_cluster

IMPORT_S = 2.0
"""The solver's import, made this slow: what a loaded machine measured, halved."""
GAP_S = IMPORT_S + 0.5
"""From the deployment's creation to its first live look: at least this (a live look needs
an instance serving and a multicast's first block; a real first load alone takes longer)."""


class SlowImport:
    """`zigzag.milp_solver` as a first import behaves: the first call takes `seconds`, a call
    meanwhile waits for it to finish (the import lock), later calls are instant."""

    def __init__(self, real, seconds: float) -> None:
        self.real, self.seconds = real, seconds
        self.lock = threading.Lock()
        self.done = False

    def __call__(self):
        with self.lock:
            if not self.done:
                time.sleep(self.seconds)
                self.done = True
        return self.real()


def first_look() -> RunBatch:
    """A tight-SLO look whose schedule is the ILP's (6 batches, `MAX_ILP_BATCHES` allows it)."""
    settings = LiveSettings(num_layers=4, live_batch=2, fallback_load_ratio=2.0, ttft_slo_s=0.01)
    waiting = tuple(Waiting(0.0, 10) for _ in range(12))
    view = LiveView(now_s=100.0, held_layers=1, sources=(LiveSource(0, 1),), waiting=waiting)
    action = LiveScalingState(settings).look(view)
    assert isinstance(action, RunBatch), action
    return action


def test_the_first_live_look_after_a_blitzscale_deployment_is_created_does_not_wait_for_the_solver(
    tmp_path, tiny_store_dir, monkeypatch
) -> None:
    monkeypatch.setattr(zigzag, "milp_solver", SlowImport(zigzag.milp_solver, IMPORT_S))
    assert warm_solver(system_config("serverlessllm")) is None  # it never live-scales
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=1)

    async def run() -> float:
        ctl = Controller(
            ControllerConfig(state_dir=state, nodes=1), cluster.addresses, cluster.token
        )
        await ctl.start()
        try:
            created = time.monotonic()
            body = {"name": "a", "model": str(tiny_store_dir), "strategy": "blitzscale"}
            await ctl.create(body)
            await asyncio.sleep(max(0.0, created + GAP_S - time.monotonic()))
            t0 = time.monotonic()
            await asyncio.to_thread(first_look)  # where `runtime/scaleout/live.py` looks
            return time.monotonic() - t0
        finally:
            await ctl.stop()

    with cluster:
        took_s = asyncio.run(run())
    # Before: the look imported the solver itself and took IMPORT_S
    assert took_s < IMPORT_S / 2, took_s
