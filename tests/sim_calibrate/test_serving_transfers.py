"""A serving agent's block transfers at its CPU share (`TestbedHost.serving_transfers_shared`,
`compute_sharing.py`, `Link.speed` in `sim/flows.py`): with transfers first, the links
at a node with a busy endpoint move blocks at 1 / (1 + e * (1/share - 1)), e the cores
that end's work takes (the sender's `send_cpu_cores`, the receiver's the rest of
`transfer_cores`); off, every transfer goes first (the old model)."""

import numpy as np
import pytest

from benchmarks.sim_calibrate.compute_sharing import ComputeSharing
from benchmarks.sim_calibrate.testbed import TestbedHost
from surge.errors import SurgeError
from surge.sim.events import EventLoop, Priority
from surge.sim.flows import FlowNetwork
from surge.sim.placement import Placement
from surge.traces.request import Trace
from tests.sim_calibrate.testbed_burst import burst_on_testbed


def test_a_slowed_link_slows_its_flows_and_restores():
    loop = EventLoop()
    net = FlowNetwork(loop)
    a, b = net.add_link("a", 8.0), net.add_link("b", 8.0)  # 1 GB/s each
    done = {}
    net.start((a, b), 1e9, lambda: done.setdefault("f", loop.now_s))
    # half moved at full speed, then 0.25 GB in 1 s at a quarter, the rest at full speed
    loop.schedule(0.5, Priority.CONTROL, 0, lambda: net.set_link_speeds({b: 0.25}))
    loop.schedule(1.5, Priority.CONTROL, 0, lambda: net.set_link_speeds({b: 1.0}))
    loop.run()
    assert done["f"] == pytest.approx(1.5 + 0.25)


class BusyEndpoint:
    """A busy endpoint on GPUs `gpus` at processor share `share`."""

    def __init__(self, iid: int, gpus: tuple[int, ...], share: float) -> None:
        self.id = iid
        self.busy = True
        self.share = share
        self.placement = Placement(tuple((g,) for g in gpus), 0)

    def set_share(self, share: float) -> None:
        self.share = share


def test_links_at_a_serving_node_move_at_its_share():
    loop = EventLoop()
    net = FlowNetwork(loop)
    links = {g: (net.add_link(f"out/{g}", 1.0), net.add_link(f"in/{g}", 1.0)) for g in (0, 1)}
    sharing = ComputeSharing(
        net, 1.0, 0.3, transfers_first=True,
        links_of_gpu=lambda g: ((links[g][0],), (links[g][1],)), send_cpu_cores=0.1,
    )  # fmt: skip
    busy = BusyEndpoint(7, (0,), 1.0)
    sharing.on_busy(busy)  # alone on 1 core: share 1, nothing slowed
    assert [link.speed for link in links[0]] == [1.0, 1.0]
    other = BusyEndpoint(8, (1,), 1.0)
    sharing.on_busy(other)  # two on 1 core: share 0.5, wait factor 1/0.5 - 1 = 1
    out, into = links[0]
    assert out.speed == pytest.approx(1 / (1 + 0.1))  # the sender's 0.1 core
    assert into.speed == pytest.approx(1 / (1 + 0.2))  # the receiver's 0.3 - 0.1
    other.busy = False
    sharing.on_busy(other)
    busy.busy = False
    sharing.on_busy(busy)  # idle again: back to full speed
    assert [link.speed for g in (0, 1) for link in links[g]] == [1.0] * 4


def _run(tmp_path, shared: bool) -> tuple[float, float]:
    """2 nodes, a 1-core host, a slow link: the warm instance serves 4 requests while it
    sends its blocks. (when the last request is done, when node 1's first block lands)"""
    from surge.events import BlockLanded, Recorder
    from surge.sim.simulator import Simulation

    trace = Trace("t", np.zeros(4), np.full(4, 4), np.full(4, 1))
    settings, system, host = burst_on_testbed(
        tmp_path, 2, 1e-3, "none", shared_cores=1.0, transfer_cores=0.5,
        transfers_first=True, serving_transfers_shared=shared, send_cpu_cores=0.4,
    )  # fmt: skip
    recorder = Recorder()
    res = Simulation(trace, settings, system, timeline=recorder, host=host).run()
    landed = [e.t_s for e in recorder.events if isinstance(e, BlockLanded) and e.node == 1]
    return float(res.done_s.max()), min(landed)


def test_a_serving_sender_sends_slower(tmp_path):
    """The warm instance (share 0.5: transfers first leave it half the core) sends while it
    serves; its egress moves at 1 / (1 + 0.4 * (1/0.5 - 1)) = 1/1.4 until it is idle, so
    the first block lands later by (1 - 1/1.4) of the serving time (from the scale-out's
    start, 1 ms)."""
    served_off, first_off = _run(tmp_path, False)
    served_on, first_on = _run(tmp_path, True)
    assert served_on == pytest.approx(served_off)  # serving itself is unchanged
    assert first_off > served_off  # the block is still moving when serving ends
    assert first_on - first_off == pytest.approx((1 - 1 / 1.4) * (served_on - 0.001), abs=1e-6)


def test_settings_checked():
    with pytest.raises(SurgeError, match="serving_transfers_shared needs transfers_first"):
        TestbedHost(shared_cores=2.0, serving_transfers_shared=True)
    with pytest.raises(SurgeError, match="send_cpu_cores must be between"):
        TestbedHost(transfer_cores=0.1, send_cpu_cores=0.2)
