"""BlitzScale's sources by bandwidth left (`SystemConfig.sources_by_bandwidth`, §5.1 Alg. 1
lines 5 and 10) in the simulator: scale-outs that follow one another each get a source
whose egress is free (a free GPU copy, the parameter pool's host copy, or the tail of an
earlier multicast still in flight, which forwards blocks as they land), so no source's
NIC is split between several multicasts. Without it every scale-out of a ramp takes the
one free deployed instance and the loads slow one another down."""

from dataclasses import replace

import numpy as np
import pytest

from surge.events import InstanceUp, Recorder, ScaleOutStarted
from surge.policy.multicast.plan import Transfer, make_plan
from surge.policy.slo import BLITZSCALE_SLOS
from surge.policy.systems import system_config
from surge.sim.events import EventLoop, Priority
from surge.sim.flows import FlowNetwork
from surge.sim.hardware import cluster_from_spec, cluster_spec
from surge.sim.models import load_model
from surge.sim.multicast_run import MulticastRun
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.request import Trace

NIC_GBPS = 100.0


def _cluster() -> object:
    """BlitzScale cluster B as 16 one-GPU logical hosts (§6.2's method)."""
    group = {
        **cluster_spec("blitzscale-b")["groups"][0],
        "num_nodes": 16,
        "gpus_per_node": 1,
        "nic_gbps": NIC_GBPS,
        "host_memory_gib": 125,
    }
    return cluster_from_spec("b-logical", {"groups": [group]})


def _ramp(peak_rps: float = 40.0, duration_s: float = 5.0) -> Trace:
    """Arrivals whose rate grows linearly to `peak_rps`: the monitor adds instances one
    decision after another, each its own scale-out. 5 s (10 s until BlitzScale's monitor
    counted waiting prompt tokens against its profiled bound, §5.3: over 10 s it adds them
    one at a time, few loads overlap and the test showed little)."""
    n = int(peak_rps * duration_s / 2)
    t = np.sqrt(2 * duration_s * np.arange(n) / peak_rps)
    return Trace("ramp", t, np.full(n, 2000), np.full(n, 8))


def _load_times(by_bandwidth: bool) -> list[float]:
    system = replace(system_config("blitzscale"), sources_by_bandwidth=by_bandwidth)
    settings = SimSettings(
        _cluster(), ("llama2-7b",), "blitzscale", slo=BLITZSCALE_SLOS["llama2-7b"]
    )
    recorder = Recorder()
    res = Simulation(_ramp(), settings, system, timeline=recorder).run()
    assert (res.done_s >= 0).all()
    started: dict[int, float] = {}
    times = []
    for ev in recorder.events:  # one GPU per host: a machine holds one instance
        if isinstance(ev, ScaleOutStarted):
            started.update({m: ev.t_s for m in ev.nodes})
        elif isinstance(ev, InstanceUp) and ev.node in started:
            times.append(ev.t_s - started.pop(ev.node))
    return times


def test_each_scale_out_of_a_ramp_gets_a_free_source() -> None:
    assert system_config("blitzscale").sources_by_bandwidth
    one_link_s = load_model("llama2-7b").total_bytes * 8 / (NIC_GBPS * 1e9)
    on, off = _load_times(True), _load_times(False)
    assert len(on) >= 5 and len(off) >= 5
    # by bandwidth: a load runs at one NIC's speed (a chain tail adds a block or so) while
    # a free source is left; busy prefill instances are no source (P/D, §5.1), so the last
    # scale-outs of the ramp, when nearly every instance prefills, may share one
    at_link_speed = [t for t in on if t < 1.1 * one_link_s]
    assert len(at_link_speed) >= 0.75 * len(on), (on, one_link_s)
    # without: scale-outs share the one free instance's egress and slow one another
    assert max(off) > 2 * one_link_s, (max(off), one_link_s)
    assert np.mean(on) < 0.8 * np.mean(off)


def test_a_source_still_receiving_forwards_blocks_only_as_they_land() -> None:
    loop = EventLoop()
    net = FlowNetwork(loop)
    link = net.add_link("l", 8.0)  # 1 GB/s
    steps = [[Transfer(0, 1, b)] for b in range(3)]
    plan = make_plan("chain", 2, 3, 1, steps)
    landed: list[tuple[int, float]] = []
    finished: list[float] = []
    run = MulticastRun(
        net,
        plan,
        lambda src, dst: (link,),
        int(1e9),
        lambda node, block: landed.append((block, loop.now_s)),
        lambda: finished.append(loop.now_s),
        partial_sources={0: {0}},
    )
    run.start()
    loop.run()
    assert landed == [(0, pytest.approx(1.0))] and not finished  # block 1 not at the source
    loop.schedule(5.0, Priority.CONTROL, 0, lambda: run.source_got(0, 1))
    loop.schedule(5.5, Priority.CONTROL, 0, lambda: run.source_got(0, 2))
    loop.run()
    assert [b for b, _ in landed] == [0, 1, 2]
    assert landed[1][1] == pytest.approx(6.0) and landed[2][1] == pytest.approx(7.0)
    assert finished == [pytest.approx(7.0)]
