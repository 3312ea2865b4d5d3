"""The CPU testbed's compute sharing (`TestbedHost.shared_cores`, transfer CPU): an endpoint's
share stretches its steps; busy endpoints and block transfers split the host's cores."""

import numpy as np

from benchmarks.sim_calibrate.testbed import TestbedHost
from surge.policy.systems import system_config
from surge.sim.costs import CostModel
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop
from surge.sim.instance import Instance
from surge.sim.request import SimRequest
from surge.sim.settings import SimSettings
from surge.sim.simulator import simulate
from surge.traces.request import Trace
from tests.sim.burst_files import cluster_file, model_file
from tests.sim_calibrate.testbed_burst import burst_on_testbed

COST = CostModel(0.1, 0.0, 0.1, 0.0, 1)  # 0.1 s per prefill step, 0.1 s per decode step


def test_share_change_stretches_a_prefill_in_flight():
    loop = EventLoop()
    spec = EngineSpec(COST, "both", 4, 10_000, 10_000)
    inst = Instance(1, loop, spec, lambda i, r: None, lambda i, r: None)
    req = SimRequest(0, 0, 0.0, 4, 1)
    inst.submit(req)
    loop.schedule(0.05, 0, 0, lambda: inst.set_share(0.5))
    loop.run(10.0)
    # 0.05 s at full speed, the remaining 0.05 s of work at half speed: 0.15 s.
    assert abs(req.first_token_s - 0.15) < 1e-9


def test_shared_cores_slow_concurrent_instances(tmp_path):
    model = model_file(tmp_path)
    trace = Trace("t", np.zeros(8), np.full(8, 4), np.full(8, 1))
    ttft = {}
    for cores in (None, 4.0, 1.0):
        settings = SimSettings(
            cluster_file(tmp_path, 4), (str(model),), "ideal", max_batch=2, warm_instances=4
        )
        host = TestbedHost(shared_cores=cores)
        res = simulate(trace, settings, system=system_config("ideal"), host=host)
        ttft[cores] = float(np.max(res.first_token_s - res.arrival_s))
    # 0.1 s per prefill step; each of the 4 instances gets 2 requests: 0.2 s alone.
    assert abs(ttft[None] - 0.2) < 1e-6
    assert ttft[4.0] == ttft[None]  # one core each: no slowdown
    assert ttft[1.0] > 3.5 * ttft[None]  # four busy instances on one core


def test_block_transfers_take_shared_cores_from_the_endpoints(tmp_path):
    trace = Trace("t", np.zeros(4), np.full(4, 4), np.full(4, 1))
    first = {}
    for tc in (0.0, 1.0):
        # 2 nodes, slow links: one block transfer is in flight for all of the first prefill.
        settings, system, host = burst_on_testbed(
            tmp_path, 2, 1e-3, "none", shared_cores=1.0, transfer_cores=tc
        )
        res = simulate(trace, settings, system=system, host=host)
        first[tc] = float(np.min(res.first_token_s - res.arrival_s))
    # The warm instance prefills (0.1 s) alone; with a transfer counted as one more
    # consumer from t = 1 ms it gets half the core: 0.001 + 2 * 0.099 s.
    assert abs(first[0.0] - 0.1) < 1e-6
    assert abs(first[1.0] - 0.199) < 1e-6
