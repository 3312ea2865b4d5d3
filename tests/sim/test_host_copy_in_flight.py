"""A host copy counts once its bytes are in host memory, not when its load begins.

ServerlessLLM loads a missed model from the store through host memory (`sim/fetch.py`);
before, the model entered the host cache when that load began, so a second scale-out on
the same machine a moment later "hit" a copy still in flight and loaded at PCIe speed
(in ParaServe §8.3's bursts that gave ServerlessLLM hits it could not have; issue 18).
Now the second load waits for the copy in flight, then loads from host memory: one read
of the store, nobody serving before it has landed.
"""

import numpy as np

from surge.sim.hardware import cluster_from_spec, cluster_spec
from surge.sim.metrics import ttft_s
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.request import make_trace


def _one_v100_server():
    spec = cluster_spec("paraserve-2")
    v100 = [{**g, "num_nodes": 1} for g in spec["groups"] if g["gpu"] == "V100"]
    return cluster_from_spec("one-v100", {"groups": v100})


def test_a_second_load_does_not_read_a_copy_still_in_flight() -> None:
    # two bursts 0.3 s apart: two scale-outs on the one server while the first load
    # (13B from the registry at 16 Gb/s, ~13 s) is still in flight
    arrivals = np.r_[np.zeros(16), np.full(16, 0.3)]
    trace = make_trace("burst", arrivals, np.full(32, 256), np.full(32, 16))
    settings = SimSettings(
        _one_v100_server(), ("llama2-13b",), "serverlessllm", max_batch=8, kv_memory_fraction=1.0
    )
    res = Simulation(trace, settings).run()
    outs = [t for t, _, kind, n in res.scale_events if kind == "scale-out" for _ in range(n)]
    assert len(outs) >= 2 and max(outs) < 5.0, res.scale_events
    assert res.cache_misses == 1 and res.cache_hits == len(outs) - 1
    fetch_s = 24.2e9 * 8 / 16e9  # the registry at the server's 16 Gb/s
    assert ttft_s(res).min() > fetch_s, ttft_s(res).min()
    # the waiting load reads host memory after the copy lands, not the store again
    assert ttft_s(res).max() < fetch_s + 5.0, ttft_s(res).max()


def test_a_later_load_hits_the_copy_once_it_has_landed() -> None:
    # the second burst comes after the first load ended and its instance was released
    arrivals = np.r_[np.zeros(4), np.full(4, 200.0)]
    trace = make_trace("two", arrivals, np.full(8, 256), np.full(8, 16))
    settings = SimSettings(
        _one_v100_server(), ("llama2-13b",), "serverlessllm", max_batch=8, kv_memory_fraction=1.0
    )
    res = Simulation(trace, settings).run()
    assert res.cache_misses == 1 and res.cache_hits >= 1
    late = ttft_s(res)[4:]
    assert late.max() < 5.0, late  # from host memory over PCIe
