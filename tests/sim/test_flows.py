"""Flows share link bandwidth and speed up when a neighbour finishes."""

import pytest

from surge.sim.events import EventLoop
from surge.sim.flows import FlowNetwork

GB = 1e9


def test_two_flows_share_a_link_then_the_survivor_speeds_up():
    loop = EventLoop()
    net = FlowNetwork(loop)
    link = net.add_link("nic", 8.0)  # 1 GB/s
    done: dict[str, float] = {}
    net.start((link,), 1 * GB, lambda: done.setdefault("a", loop.now_s))
    net.start((link,), 2 * GB, lambda: done.setdefault("b", loop.now_s))
    loop.run()
    # both at 0.5 GB/s until a finishes at 2 s (b has 1 GB left), then b alone at 1 GB/s
    assert done["a"] == pytest.approx(2.0)
    assert done["b"] == pytest.approx(3.0)


def test_flow_runs_at_its_bottleneck_and_disjoint_flows_do_not_interfere():
    loop = EventLoop()
    net = FlowNetwork(loop)
    fast, slow, other = (
        net.add_link("fast", 80.0),
        net.add_link("slow", 8.0),
        net.add_link("o", 8.0),
    )
    done: dict[str, float] = {}
    net.start((fast, slow), 1 * GB, lambda: done.setdefault("x", loop.now_s))
    net.start((other,), 1 * GB, lambda: done.setdefault("y", loop.now_s))
    loop.run()
    assert done["x"] == pytest.approx(1.0)
    assert done["y"] == pytest.approx(1.0)
    assert net.num_active == 0


def test_fixed_latency_delays_each_flow():
    loop = EventLoop()
    net = FlowNetwork(loop, fixed_latency_s=0.25)
    link = net.add_link("l", 8.0)
    done: list[float] = []
    net.start((link,), 1 * GB, lambda: done.append(loop.now_s))
    loop.run()
    assert done == [pytest.approx(1.25)]


def test_speed_change_stretches_flows_in_flight():
    loop = EventLoop()
    net = FlowNetwork(loop)
    link = net.add_link("nic", 8.0)  # 1 GB/s
    done: dict[str, float] = {}
    net.start((link,), 1 * GB, lambda: done.setdefault("a", loop.now_s))
    loop.schedule(0.5, 0, 0, lambda: net.set_speed(0.5))
    loop.run()
    # 0.5 GB at full speed, the other 0.5 GB at 0.5 GB/s: 1.5 s.
    assert done["a"] == pytest.approx(1.5)
