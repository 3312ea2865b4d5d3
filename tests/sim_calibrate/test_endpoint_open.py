"""Endpoint opening on the CPU testbed (`TestbedHost.endpoint_open_s`, `sim/carrier.py`): a
multicast's endpoints open one after another, each costing the controller time, as the
runtime's carrier (`runtime/scaleout/multicast.LoadingCarrier`) opens them."""

import itertools
from dataclasses import replace

import pytest

from benchmarks.sim_calibrate.testbed import TestbedHost
from surge.errors import SurgeError
from surge.events import BlockLanded, InstanceUp, PipelineOpened, Recorder
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.systems import system_config
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.request import make_trace

NODES = 6
REQUESTS = 48
OPEN_S = 0.4
PIPE_OPEN_S = 0.25


def run(open_s: float, pipe_open_s: float, mode: str = "pipelines") -> dict:
    """One warm λScale instance, a burst at t=0 scaled out by one multicast (no host
    copies, so every new node waits for its blocks)."""
    system = replace(
        system_config("lambdascale"),
        host_cache="none",
        serve_while_loading=mode,
        decision_interval_s=1e-3,
        autoscale=AutoscaleSettings(target_ongoing_requests=REQUESTS / NODES),
    )
    settings = SimSettings(
        "lambdascale-testbed1",
        ("llama2-7b",),
        "lambdascale",
        warm_instances=1,
        max_batch=4,
    )
    host = TestbedHost(endpoint_open_s=open_s, pipeline_open_s=pipe_open_s)
    trace = make_trace("burst", [0.0] * REQUESTS, [200] * REQUESTS, [16] * REQUESTS)
    recorder = Recorder()
    res = Simulation(trace, settings, system, timeline=recorder, host=host).run()
    last_block: dict[int, float] = {}
    for ev in recorder.events:
        if isinstance(ev, BlockLanded) and ev.tier == "gpu":
            last_block[ev.node] = max(last_block.get(ev.node, 0.0), ev.t_s)
    ups = sorted(
        (ev.t_s, ev.node) for ev in recorder.events if isinstance(ev, InstanceUp) and ev.t_s > 0
    )
    pipes = [ev.t_s for ev in recorder.events if isinstance(ev, PipelineOpened)]
    ttft = sorted(float(f - a) for f, a in zip(res.first_token_s, res.arrival_s, strict=True))
    done = sorted(float(d) for d in res.done_s)
    return {"ups": ups, "last_block": last_block, "pipes": pipes, "ttft": ttft, "done": done}


@pytest.fixture(scope="module")
def runs() -> dict:
    return {
        "off": run(0.0, 0.0),
        "on": run(OPEN_S, PIPE_OPEN_S),
        "stw_off": run(0.0, 0.0, "none"),
        "stw_on": run(OPEN_S, 0.0, "none"),
    }


def test_without_a_cost_an_instance_serves_when_its_last_block_lands(runs):
    off = runs["stw_off"]
    assert len(off["ups"]) >= 3, "the burst should scale out to several new nodes"
    for t, node in off["ups"]:
        assert t == pytest.approx(off["last_block"][node])


def test_openings_run_one_after_another_each_taking_endpoint_open_s(runs):
    on = runs["stw_on"]
    assert len(on["ups"]) == len(runs["stw_off"]["ups"])
    times = [t for t, _ in on["ups"]]
    for t, node in on["ups"]:
        assert t >= on["last_block"][node] + OPEN_S - 1e-9
    # serialised on the multicast's carrier: consecutive openings OPEN_S apart at least
    for a, b in itertools.pairwise(times):
        assert b - a >= OPEN_S - 1e-9
    # the first starts when its node is whole (nothing else was opening)
    first_t, first_node = on["ups"][0]
    assert first_t == pytest.approx(min(on["last_block"].values()) + OPEN_S)
    assert on["last_block"][first_node] == min(on["last_block"].values())


def test_pipelines_open_after_pipeline_open_s_and_delay_what_follows(runs):
    off, on = runs["off"], runs["on"]
    assert off["pipes"], "λScale opens execution pipelines on this burst"
    assert len(on["pipes"]) == len(off["pipes"])
    assert on["pipes"][0] == pytest.approx(off["pipes"][0] + PIPE_OPEN_S)
    # the time-to-first-token of the burst includes the openings
    assert sorted(on["ttft"])[len(on["ttft"]) // 2] > sorted(off["ttft"])[len(off["ttft"]) // 2]
    assert max(on["ttft"]) > max(off["ttft"])


def test_negative_open_costs_are_refused():
    with pytest.raises(SurgeError, match="endpoint_open_s"):
        TestbedHost(endpoint_open_s=-1)
