"""Batch refills, calibrated per-layer costs, pipeline capacity (`pipeline_micro_batches`) and
pipeline speed (`pipeline_speed`). The burst helpers here serve the CPU testbed's tests too
(`tests/sim_calibrate`)."""

from collections import deque

import numpy as np
import pytest

from surge.errors import SurgeError
from surge.policy.systems import system_config
from surge.sim.costs import CostModel
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop
from surge.sim.instance import Instance
from surge.sim.request import SimRequest
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation, simulate
from surge.traces.request import Trace, make_trace
from tests.sim.burst_files import burst_sim, cluster_file, model_file

COST = CostModel(0.1, 0.0, 0.1, 0.0, 1)  # 0.1 s per prefill step, 0.1 s per decode step


def _instance(loop: EventLoop, on_done=lambda inst, req: None, max_batch: int = 4) -> Instance:
    spec = EngineSpec(COST, "both", max_batch, 10_000, 10_000)
    return Instance(1, loop, spec, on_done, lambda i, r: None)


def test_requests_submitted_while_a_batch_finishes_are_all_served():
    loop = EventLoop()
    queue = deque(SimRequest(i, 0, 0.0, 4, 3) for i in range(12))
    inst = _instance(loop, on_done=lambda i, r: queue and i.submit(queue.popleft()))
    for _ in range(4):
        inst.submit(queue.popleft())
    loop.run(100.0)
    # Every request of every refill gets served (none dropped by a restarted prefill).
    assert not queue and inst.tokens_done == 12 * 3


def test_measured_layer_costs_apply(tmp_path):
    model = model_file(tmp_path)
    trace = Trace("t", np.zeros(8), np.full(8, 4), np.full(8, 1))
    settings = SimSettings(
        cluster_file(tmp_path, 4), (str(model),), "ideal", max_batch=2, warm_instances=4
    )
    res = simulate(trace, settings, system=system_config("ideal"))
    # Measured per-layer costs: 10 layers x 0.01 s = 0.1 s per prefill step; each of the
    # 4 instances gets 2 requests, the second prefilled after the first: 0.2 s.
    assert abs(float(np.max(res.first_token_s - res.arrival_s)) - 0.2) < 1e-6


def test_pipelines_take_micro_batches_times_the_batch_limit(tmp_path, monkeypatch):
    most: dict[int, int] = {}
    submit = Instance.submit

    def record(inst, req, start=True):
        submit(inst, req, start)
        if len(inst.placement.workers) > 1:  # an execution pipeline
            most[inst.id] = max(most.get(inst.id, 0), inst.outstanding)

    monkeypatch.setattr(Instance, "submit", record)
    trace = Trace("t", np.zeros(64), np.full(64, 4), np.full(64, 4))
    for micro in (1, 2):
        most.clear()
        settings, system = burst_sim(tmp_path, 4, 0.01, "pipelines", pipeline_micro_batches=micro)
        res = simulate(trace, settings, system=system)
        assert np.all(res.done_s > 0)
        assert most and max(most.values()) == micro  # max_batch = 1


def test_pipelines_default_to_one_micro_batch_per_stage(tmp_path, monkeypatch):
    """λScale §4.3 Fig. 6a: each stage of an execution pipeline works on a different batch,
    so a g-stage pipeline holds g batches and serves a burst sooner than one batch at a
    time through every stage (the simulator's old model)."""
    seen: dict[int, tuple[int, int, int]] = {}
    submit = Instance.submit

    def record(inst, req, start=True):
        submit(inst, req, start)
        stages = len(inst.placement.workers)
        if stages > 1:  # an execution pipeline
            most = max(seen.get(inst.id, (0, 0, 0))[0], inst.outstanding)
            seen[inst.id] = (most, stages, inst.micro_batches)

    monkeypatch.setattr(Instance, "submit", record)
    trace = Trace("t", np.zeros(64), np.full(64, 4), np.full(64, 4))
    done = {}
    for micro in (None, 1):
        seen.clear()
        settings, system = burst_sim(tmp_path, 4, 0.01, "pipelines", pipeline_micro_batches=micro)
        res = simulate(trace, settings, system=system)
        assert np.all(res.done_s > 0)
        assert seen
        if micro is None:  # max_batch = 1: one sequence per stage, each stage its own
            assert all(most == stages == m for most, stages, m in seen.values())
        else:
            assert all(most == m == 1 for most, _, m in seen.values())
        done[micro] = float(np.mean(res.first_token_s - res.arrival_s))
    assert done[None] < done[1]


def test_pipeline_speed_slows_execution_pipelines_only():
    """`SimSettings.pipeline_speed` (the runtime's measured pipeline throughput over the
    model's): a pipeline's requests take 1/speed as long; a plain instance's do not."""
    from types import SimpleNamespace

    from surge.sim.host import DedicatedHost
    from surge.sim.instance_factory import InstanceFactory
    from surge.sim.placement import Placement
    from surge.sim.pools import Pool
    from surge.sim.request import SimRequest

    def done_s(pipeline: bool, speed: float) -> float:
        settings = SimSettings(
            "lambdascale-testbed1", ("llama2-7b",), "lambdascale", pipeline_speed=speed
        )
        trace = make_trace("one", [0.0], [1], [1])
        world = Simulation(trace, settings).world
        done: list[float] = []
        requests = SimpleNamespace(
            on_done=lambda i, r: done.append(world.loop.now_s), on_prefilled=lambda i, r: None
        )
        factory = InstanceFactory(world, requests, DedicatedHost())  # type: ignore[arg-type]
        placement = Placement(((0,), (1,)) if pipeline else ((0,),), 0)
        ep = factory.make(Pool(0, 0, "both"), placement, pipeline=pipeline)
        ep.submit(SimRequest(0, 0, 0.0, 500, 20))
        world.loop.run()
        return done[0]

    assert done_s(True, 0.5) > 1.5 * done_s(True, 1.0)  # compute at half speed; hops not
    assert done_s(False, 0.5) == done_s(False, 1.0)
    with pytest.raises(SurgeError, match="pipeline_speed"):
        SimSettings("lambdascale-testbed1", ("llama2-7b",), "lambdascale", pipeline_speed=0)
