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
START_WAIT_S = 30.0
"""How long the test waits for the background import to begin after the deployment is
created (it begins at once; the bound only keeps a broken warm-up from hanging the test)."""


class SlowImport:
    """`zigzag.milp_solver` as a first import behaves: the first call takes `seconds`, a call
    meanwhile waits for it to finish (the import lock), later calls are instant."""

    def __init__(self, real, seconds: float) -> None:
        self.real, self.seconds = real, seconds
        self.lock = threading.Lock()
        self.done = False
        self.importer: int | None = None
        """The thread that paid for the import (None until one began)."""
        self.started = threading.Event()

    def __call__(self):
        with self.lock:
            if not self.done:
                self.importer = threading.get_ident()
                self.started.set()
                time.sleep(self.seconds)
                self.done = True
        return self.real()


def first_look() -> tuple[RunBatch, int]:
    """A tight-SLO look whose schedule is the ILP's (6 batches, `MAX_ILP_BATCHES` allows it),
    and the thread it ran on."""
    settings = LiveSettings(num_layers=4, live_batch=2, fallback_load_ratio=2.0, ttft_slo_s=0.01)
    waiting = tuple(Waiting(0.0, 10) for _ in range(12))
    view = LiveView(now_s=100.0, held_layers=1, sources=(LiveSource(0, 1),), waiting=waiting)
    action = LiveScalingState(settings).look(view)
    assert isinstance(action, RunBatch), action
    return action, threading.get_ident()


def test_the_first_live_look_after_a_blitzscale_deployment_is_created_does_not_wait_for_the_solver(
    tmp_path, tiny_store_dir, monkeypatch
) -> None:
    slow = SlowImport(zigzag.milp_solver, IMPORT_S)
    monkeypatch.setattr(zigzag, "milp_solver", slow)
    assert warm_solver(system_config("serverlessllm")) is None  # it never live-scales
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=1)

    async def run() -> tuple[bool, int]:
        ctl = Controller(
            ControllerConfig(state_dir=state, nodes=1), cluster.addresses, cluster.token
        )
        await ctl.start()
        try:
            body = {"name": "a", "model": str(tiny_store_dir), "strategy": "blitzscale"}
            await ctl.create(body)
            began = await asyncio.to_thread(slow.started.wait, START_WAIT_S)
            # where `runtime/scaleout/live.py` looks
            _, look_thread = await asyncio.to_thread(first_look)
            return began, look_thread
        finally:
            await ctl.stop()

    with cluster:
        began, look_thread = asyncio.run(run())
    # Behaviour, not a stopwatch: creating the deployment began the import in the background,
    # so the live look never paid for it. Before: nothing began it and the look imported the
    # solver itself (IMPORT_S on its own thread).
    assert began, f"no solver import began within {START_WAIT_S} s of creating the deployment"
    assert slow.importer is not None and slow.importer != look_thread
