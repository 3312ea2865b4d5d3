"""The simulator's host seam (`surge/sim/host.py`): a real GPU cluster by default
(`DedicatedHost`), or a host model a benchmark passes in (`Simulation(host=...)`), which is
told of every endpoint and block transfer and decides what each loading action costs. The
CPU testbed's fitted fields are not the product simulator's (issue 31)."""

import dataclasses
from dataclasses import replace

import numpy as np
import pytest

from surge.events import InstanceUp, Recorder
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.loading import GoLocal
from surge.policy.systems import system_config
from surge.sim.host import DedicatedHost
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.sim.world import World
from surge.traces.request import make_trace

REQUESTS = 48
OPEN_S = 0.5


class RecordingHost(DedicatedHost):
    """A host that records what the simulator tells it; opening a local instance costs
    `open_s`."""

    def __init__(self, world: World, open_s: float) -> None:
        self.world, self.open_s = world, open_s
        self.attached: list[int] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.senders: set[int] = set()

    def attach(self, inst) -> None:
        self.attached.append(inst.id)

    def on_transfers(self, delta, sender_gpu, egress) -> None:
        self.in_flight += delta
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if sender_gpu is not None:
            assert egress is not None
            self.senders.add(sender_gpu)

    def action_s(self, action: object) -> float:
        return self.open_s if isinstance(action, GoLocal) else 0.0


def run(host=None) -> tuple[list[float], np.ndarray]:
    """A burst on one warm λScale instance, scaled out by one multicast, stop-the-world."""
    system = replace(
        system_config("lambdascale"),
        host_cache="none",
        serve_while_loading="none",
        decision_interval_s=1e-3,
        autoscale=AutoscaleSettings(target_ongoing_requests=REQUESTS / 6),
    )
    settings = SimSettings(
        "lambdascale-testbed1", ("llama2-7b",), "lambdascale", warm_instances=1, max_batch=4
    )
    trace = make_trace("burst", [0.0] * REQUESTS, [200] * REQUESTS, [16] * REQUESTS)
    recorder = Recorder()
    res = Simulation(trace, settings, system, timeline=recorder, host=host).run()
    ups = sorted(ev.t_s for ev in recorder.events if isinstance(ev, InstanceUp) and ev.t_s > 0)
    return ups, res.first_token_s - res.arrival_s


def test_the_host_model_is_told_of_endpoints_and_transfers_and_times_openings():
    hosts: list[RecordingHost] = []

    def factory(world: World) -> RecordingHost:
        hosts.append(RecordingHost(world, OPEN_S))
        return hosts[-1]

    free_ups, free_ttft = run()
    ups, ttft = run(factory)
    (host,) = hosts
    assert len(free_ups) >= 3, "the burst scales out to several new nodes"
    # every endpoint made, the warm one included, was attached
    assert len(host.attached) >= 1 + len(ups)
    # every block transfer that started ended; the warm instance's GPU sent some
    assert host.most_in_flight > 0 and host.in_flight == 0 and host.senders
    # each opening took OPEN_S, one after another on the multicast's carrier
    assert ups[0] >= free_ups[0] + OPEN_S - 1e-9
    assert np.percentile(ttft, 90) > np.percentile(free_ttft, 90)


def test_the_default_host_is_a_real_cluster():
    default_ups, default_ttft = run()
    ups, ttft = run(lambda world: DedicatedHost())
    assert ups == default_ups and np.array_equal(ttft, default_ttft)


def test_the_cpu_testbed_fields_are_not_simulator_settings():
    names = {f.name for f in dataclasses.fields(SimSettings)}
    testbed = {"shared_cores", "transfer_cores", "transfers_first", "endpoint_open_s"}
    assert not names & testbed
    with pytest.raises(TypeError):
        SimSettings("lambdascale-testbed1", ("llama2-7b",), "lambdascale", shared_cores=2.0)  # type: ignore[call-arg]
