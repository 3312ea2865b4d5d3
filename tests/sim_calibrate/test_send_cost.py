"""Sending and serving on one node (`TestbedHost.send_cost_s_per_gb`,
`compute_sharing.py`): while a node sends multicast blocks its endpoints serve at
(1 - send_cost_s_per_gb * GB/s sent) of their share; cost 0 is the old model."""

import numpy as np
import pytest

from benchmarks.sim_calibrate.compute_sharing import ComputeSharing
from benchmarks.sim_calibrate.testbed import TestbedHost
from surge.errors import SurgeError
from surge.sim.costs import CostModel
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop
from surge.sim.flows import FlowNetwork
from surge.sim.instance import Instance
from surge.sim.placement import Placement
from surge.sim.simulator import simulate
from surge.traces.request import Trace
from tests.sim_calibrate.testbed_burst import burst_on_testbed

NIC_GBPS = 0.008
"""1 MB/s = 1e-3 GB/s: one block transfer lasts the whole first prefill."""


def _first_ttft(tmp_path, send_cost: float, shared_cores: float = 8.0) -> tuple[float, object]:
    trace = Trace("t", np.zeros(4), np.full(4, 4), np.full(4, 1))
    settings, system, host = burst_on_testbed(
        tmp_path, 2, NIC_GBPS, "none", shared_cores=shared_cores, send_cost_s_per_gb=send_cost
    )
    res = simulate(trace, settings, system=system, host=host)
    return float(np.min(res.first_token_s - res.arrival_s)), res


def test_a_sending_source_serves_slower_by_the_configured_share(tmp_path):
    idle, _ = _first_ttft(tmp_path, 0.0)
    # 8 cores for 1 busy endpoint: no processor sharing, only the sending loss. 500 s per
    # GB at 1e-3 GB/s = half of it: the source's first prefill (0.1 s of work, its
    # block transfer starting after the 1 ms decision interval) runs at half speed.
    sending, _ = _first_ttft(tmp_path, 500.0)
    assert idle == pytest.approx(0.1, abs=1e-6)
    assert sending == pytest.approx(0.001 + 0.099 / 0.5, abs=1e-6)
    quarter, _ = _first_ttft(tmp_path, 250.0)
    assert quarter == pytest.approx(0.001 + 0.099 / 0.75, abs=1e-6)


def test_cost_zero_is_the_old_model(tmp_path):
    trace = Trace("t", np.zeros(16), np.full(16, 4), np.full(16, 3))
    out = []
    for kw in ({}, {"send_cost_s_per_gb": 0.0}):
        settings, system, host = burst_on_testbed(
            tmp_path, 4, 0.01, "pipelines", shared_cores=2.0, transfer_cores=0.3, **kw
        )
        res = simulate(trace, settings, system=system, host=host)
        out.append((res.first_token_s.tobytes(), res.done_s.tobytes()))
    assert out[0] == out[1]
    # ... and a cost changes the result (the sources and forwarding receivers send).
    settings, system, host = burst_on_testbed(
        tmp_path, 4, 0.01, "pipelines", shared_cores=2.0, transfer_cores=0.3,
        send_cost_s_per_gb=200.0,
    )  # fmt: skip
    res = simulate(trace, settings, system=system, host=host)
    assert res.done_s.max() > np.frombuffer(out[0][1]).max()


def test_a_pipeline_runs_at_its_most_loaded_stage_and_recovers_when_sending_ends():
    loop = EventLoop()
    net = FlowNetwork(loop)
    link = net.add_link("nic-out/1", NIC_GBPS)
    sharing = ComputeSharing(net, 8.0, 0.0, send_cost_s_per_gb=400.0)
    cost = CostModel(0.1, 0.0, 0.1, 0.0, 1)
    spec = EngineSpec(cost, "both", 4, 10_000, 10_000)
    pipe = Instance(
        1, loop, spec, lambda i, r: None, lambda i, r: None,
        placement=Placement(((0,), (1,), (2,)), 0),
    )  # fmt: skip
    alone = Instance(
        2, loop, spec, lambda i, r: None, lambda i, r: None, placement=Placement(((3,),), 1)
    )
    assert sharing.serving_fraction(pipe) == 1.0
    sharing.on_transfers(1, 1, link)  # GPU 1 (the pipeline's second stage) sends
    assert sharing.serving_fraction(pipe) == pytest.approx(1 - 400.0 * 1e-3)
    assert sharing.serving_fraction(alone) == 1.0
    sharing.on_transfers(1, 1, link)  # a second transfer out of the same link: same rate
    assert sharing.serving_fraction(pipe) == pytest.approx(0.6)
    sharing.on_transfers(-1, 1, link)
    sharing.on_transfers(-1, 1, link)
    assert sharing.serving_fraction(pipe) == 1.0 and not sharing.sending
    sharing.on_transfers(1, None, None)  # a host copy sends: no serving process pays
    assert sharing.serving_fraction(pipe) == 1.0 and sharing.transfers == 1


def test_bad_send_costs_are_refused():
    with pytest.raises(SurgeError, match="send_cost_s_per_gb"):
        TestbedHost(send_cost_s_per_gb=-1)
    with pytest.raises(SurgeError, match="shared_cores"):
        TestbedHost(send_cost_s_per_gb=1)
