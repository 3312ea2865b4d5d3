"""Work reaches a simulated engine at its step boundaries, as in `surge serve`: the runtime's
engine loop admits what arrived only between steps (`runtime/engine_loop.py`), and its server
routes a queue in one pass before any engine steps (`runtime/server.py` `dispatch`). So:
- a request that reaches an engine in the middle of a decode step starts its prefill when
  that step ends (before, it preempted the step at once);
- requests queued at the router while an instance loads prefill together when it comes up
  (before, the first went alone and the rest waited for its prefill);
- requests the router hands over when a step's finished requests free room prefill together
  (before, each finished request's callback dispatched one, which started alone).
Seen in FlexPipe §9 on the emulated runtime (docs/emulation.md): the runtime's first tokens of
a drained queue came together, the simulator's one prefill apart."""

import numpy as np
import pytest

from surge.sim.batching import Batcher
from surge.sim.costs import CostModel
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop, Priority
from surge.sim.request import SimRequest
from surge.sim.settings import SimSettings
from surge.sim.simulator import simulate
from surge.traces.request import make_trace

PROMPT = 512
COST = CostModel(1e-3, 1e-5, 1e-3, 1e-5, num_layers=8)


def test_a_request_arriving_mid_decode_step_waits_for_the_step_end() -> None:
    loop = EventLoop()
    eng = Batcher(
        0, loop, EngineSpec(COST, "both", 8, 10**6, 10**6), lambda e, r: None, lambda e, r: None
    )
    first = SimRequest(0, 0, 0.0, PROMPT, 1000)
    eng.submit(first)
    prefill_s, step_s = COST.prefill_s(PROMPT), COST.decode_s(1)
    arrive_s = prefill_s + 2.5 * step_s  # half-way through the third decode step
    second = SimRequest(1, 0, arrive_s, PROMPT, 10)
    loop.schedule(arrive_s, Priority.ARRIVAL, 1, lambda: eng.submit(second))
    loop.run(until_s=1.0)
    assert first.first_token_s == pytest.approx(prefill_s)
    assert second.first_token_s == pytest.approx(prefill_s + 3 * step_s + prefill_s)
    # the running request lost no work: it generated every token of its three steps
    assert first.first_token_s < second.first_token_s


def test_a_request_arriving_at_an_idle_engine_starts_at_once() -> None:
    loop = EventLoop()
    eng = Batcher(
        0, loop, EngineSpec(COST, "both", 8, 10**6, 10**6), lambda e, r: None, lambda e, r: None
    )
    req = SimRequest(0, 0, 0.3, PROMPT, 10)
    loop.schedule(0.3, Priority.ARRIVAL, 0, lambda: eng.submit(req))
    loop.run(until_s=1.0)
    assert req.first_token_s == pytest.approx(0.3 + COST.prefill_s(PROMPT))


def _first_tokens(arrival_s: list[float], **settings) -> np.ndarray:
    n = len(arrival_s)
    trace = make_trace("t", np.array(arrival_s), np.full(n, PROMPT), np.full(n, 64))
    res = simulate(trace, SimSettings("flexpipe", ("llama2-7b",), "serverlessllm", **settings))
    assert (res.done_s > 0).all()
    return res.first_token_s


def test_requests_queued_during_a_cold_start_prefill_together() -> None:
    ft = _first_tokens([0.0, 0.001, 0.002])  # no instance: all three wait for its load
    assert ft[0] == pytest.approx(ft[1]) and ft[1] == pytest.approx(ft[2])


def test_requests_admitted_when_a_step_frees_room_prefill_together() -> None:
    # one warm instance of two sequences: the first two run, the other two wait at the
    # router until both finish (in the same step), then take the next step together
    ft = _first_tokens([0.0, 0.0, 0.0, 0.0], warm_instances=1, max_batch=2)
    assert ft[2] > ft[1]
    assert ft[2] == pytest.approx(ft[3])
