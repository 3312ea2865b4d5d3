"""Host compute sharing (`SimSettings.shared_cores`, transfer CPU), calibrated profiles, batch
refills, pipeline capacity (`pipeline_micro_batches`)."""

import json
from collections import deque
from pathlib import Path

import numpy as np

from surge.policy.systems import system_config
from surge.sim.batching import EngineSpec
from surge.sim.costs import CostModel
from surge.sim.events import EventLoop
from surge.sim.instance import Instance
from surge.sim.request import SimRequest
from surge.sim.settings import SimSettings
from surge.sim.simulator import simulate
from surge.traces.request import Trace

COST = CostModel(0.1, 0.0, 0.1, 0.0, 1)  # 0.1 s per prefill step, 0.1 s per decode step


def _instance(loop: EventLoop, on_done=lambda inst, req: None, max_batch: int = 4) -> Instance:
    spec = EngineSpec(COST, "both", max_batch, 10_000, 10_000)
    return Instance(1, loop, spec, on_done, lambda i, r: None)


def test_share_change_stretches_a_prefill_in_flight():
    loop = EventLoop()
    inst = _instance(loop)
    req = SimRequest(0, 0, 0.0, 4, 1)
    inst.submit(req)
    loop.schedule(0.05, 0, 0, lambda: inst.set_share(0.5))
    loop.run(10.0)
    # 0.05 s at full speed, the remaining 0.05 s of work at half speed: 0.15 s.
    assert abs(req.first_token_s - 0.15) < 1e-9


def test_requests_submitted_while_a_batch_finishes_are_all_served():
    loop = EventLoop()
    queue = deque(SimRequest(i, 0, 0.0, 4, 3) for i in range(12))
    inst = _instance(loop, on_done=lambda i, r: queue and i.submit(queue.popleft()))
    for _ in range(4):
        inst.submit(queue.popleft())
    loop.run(100.0)
    # Every request of every refill gets served (none dropped by a restarted prefill).
    assert not queue and inst.tokens_done == 12 * 3


def _cluster(tmp_path, nodes: int) -> str:
    gpu = {
        "name": "measured", "memory_gb": 8, "tflops": 1, "mem_bandwidth_gbs": 1,
        "prefill_efficiency": 1, "decode_efficiency": 1, "layer_overhead_s": 0,
        "measured_layer_costs_s": [0.01, 0.0, 0.01, 0.0],
    }  # fmt: skip
    group = {
        "num_nodes": nodes, "gpu": gpu, "gpus_per_node": 1, "nic_gbps": 10,
        "intra_gpu_gbps": 100, "pcie_gbps": 100, "ssd_gbps": 10, "host_memory_gb": 16,
    }  # fmt: skip
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"groups": [group]}))
    return str(path)


def _model(tmp_path) -> Path:
    """A 10-layer model file (with `_cluster`'s costs: 0.1 s per step)."""
    model = tmp_path / "tiny.json"
    model.write_text(
        json.dumps(
            {"name": "tiny", "num_layers": 10, "hidden_size": 64, "intermediate_size": 128,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
             "context_tokens": 512, "dtype_bytes": 4}
        )
    )  # fmt: skip
    return model


def test_shared_cores_slow_concurrent_instances_and_measured_costs_apply(tmp_path):
    model = _model(tmp_path)
    trace = Trace("t", np.zeros(8), np.full(8, 4), np.full(8, 1))
    ttft = {}
    for cores in (None, 4.0, 1.0):
        settings = SimSettings(
            _cluster(tmp_path, 4), (str(model),), "ideal", max_batch=2, warm_instances=4,
            shared_cores=cores,
        )  # fmt: skip
        res = simulate(trace, settings, system=system_config("ideal"))
        ttft[cores] = float(np.max(res.first_token_s - res.arrival_s))
    # Measured per-layer costs: 10 layers x 0.01 s = 0.1 s per prefill step; each of the
    # 4 instances gets 2 requests, the second prefilled after the first: 0.2 s.
    assert abs(ttft[None] - 0.2) < 1e-6
    assert ttft[4.0] == ttft[None]  # one core each: no slowdown
    assert ttft[1.0] > 3.5 * ttft[None]  # four busy instances on one core


def _burst_sim(tmp_path, nodes: int, nic_gbps: float, serve: str, **settings_kw):
    """A calibrate-style burst: 1 warm instance, everything at t=0, scale-out at once."""
    from dataclasses import replace

    from surge.policy.autoscale import AutoscaleSettings

    path = _cluster(tmp_path, nodes)
    cluster = json.loads(Path(path).read_text())
    cluster["groups"][0]["nic_gbps"] = nic_gbps
    Path(path).write_text(json.dumps(cluster))
    model = _model(tmp_path)
    system = replace(
        system_config("lambdascale"), name="ls", max_sources=1, num_blocks=4,
        serve_while_loading=serve, host_cache="none", decision_interval_s=1e-3,
        autoscale=AutoscaleSettings(target_ongoing_requests=1, downscale_delay_s=60),
    )  # fmt: skip
    settings = SimSettings(
        path, (str(model),), "ls", max_batch=1, warm_instances=1, **settings_kw
    )  # fmt: skip
    return settings, system


def test_block_transfers_take_shared_cores_from_the_endpoints(tmp_path):
    trace = Trace("t", np.zeros(4), np.full(4, 4), np.full(4, 1))
    first = {}
    for tc in (0.0, 1.0):
        # 2 nodes, slow links: one block transfer is in flight for all of the first prefill.
        settings, system = _burst_sim(
            tmp_path, 2, 1e-3, "none", shared_cores=1.0, transfer_cores=tc
        )
        res = simulate(trace, settings, system=system)
        first[tc] = float(np.min(res.first_token_s - res.arrival_s))
    # The warm instance prefills (0.1 s) alone; with a transfer counted as one more
    # consumer from t = 1 ms it gets half the core: 0.001 + 2 * 0.099 s.
    assert abs(first[0.0] - 0.1) < 1e-6
    assert abs(first[1.0] - 0.199) < 1e-6


def test_pipelines_take_micro_batches_times_the_batch_limit(tmp_path, monkeypatch):
    most: dict[int, int] = {}
    submit = Instance.submit

    def record(inst, req):
        submit(inst, req)
        if len(inst.placement.workers) > 1:  # an execution pipeline
            most[inst.id] = max(most.get(inst.id, 0), inst.outstanding)

    monkeypatch.setattr(Instance, "submit", record)
    trace = Trace("t", np.zeros(64), np.full(64, 4), np.full(64, 4))
    for micro in (1, 2):
        most.clear()
        settings, system = _burst_sim(tmp_path, 4, 0.01, "pipelines", pipeline_micro_batches=micro)
        res = simulate(trace, settings, system=system)
        assert np.all(res.done_s > 0)
        assert most and max(most.values()) == micro  # max_batch = 1


def test_pipelines_default_to_one_micro_batch_per_stage(tmp_path, monkeypatch):
    """λScale §4.3 Fig. 6a: each stage of an execution pipeline works on a different batch,
    so a g-stage pipeline holds g batches and serves a burst sooner than one batch at a
    time through every stage (the simulator's old model)."""
    seen: dict[int, tuple[int, int, int]] = {}
    submit = Instance.submit

    def record(inst, req):
        submit(inst, req)
        stages = len(inst.placement.workers)
        if stages > 1:  # an execution pipeline
            most = max(seen.get(inst.id, (0, 0, 0))[0], inst.outstanding)
            seen[inst.id] = (most, stages, inst.micro_batches)

    monkeypatch.setattr(Instance, "submit", record)
    trace = Trace("t", np.zeros(64), np.full(64, 4), np.full(64, 4))
    done = {}
    for micro in (None, 1):
        seen.clear()
        settings, system = _burst_sim(tmp_path, 4, 0.01, "pipelines", pipeline_micro_batches=micro)
        res = simulate(trace, settings, system=system)
        assert np.all(res.done_s > 0)
        assert seen
        if micro is None:  # max_batch = 1: one sequence per stage, each stage its own
            assert all(most == stages == m for most, stages, m in seen.values())
        else:
            assert all(most == m == 1 for most, _, m in seen.values())
        done[micro] = float(np.mean(res.first_token_s - res.arrival_s))
    assert done[None] < done[1]
