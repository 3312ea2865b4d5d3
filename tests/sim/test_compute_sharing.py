"""Host compute sharing (`SimSettings.shared_cores`), calibrated profiles, batch refills."""

import json
from collections import deque

import numpy as np

from surge.sim.costs import CostModel
from surge.sim.events import EventLoop
from surge.sim.instance import Instance
from surge.sim.request import SimRequest
from surge.sim.settings import SimSettings
from surge.sim.simulator import simulate
from surge.sim.systems import system_config
from surge.traces.request import Trace

COST = CostModel(0.1, 0.0, 0.1, 0.0, 1)  # 0.1 s per prefill step, 0.1 s per decode step


def _instance(loop: EventLoop, on_done=lambda inst, req: None, max_batch: int = 4) -> Instance:
    return Instance(
        1, loop, COST, "both", max_batch, 10_000, 10_000,
        lambda r: None, on_done, lambda i, r: None,
    )  # fmt: skip


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


def test_shared_cores_slow_concurrent_instances_and_measured_costs_apply(tmp_path):
    model = tmp_path / "tiny.json"
    model.write_text(
        json.dumps(
            {"name": "tiny", "num_layers": 10, "hidden_size": 64, "intermediate_size": 128,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
             "context_tokens": 512, "dtype_bytes": 4}
        )
    )  # fmt: skip
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
