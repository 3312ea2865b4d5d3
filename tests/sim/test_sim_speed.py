"""The simulator's shortcuts change no result: each run equals the straightforward path.

The shortcuts (`sim.simulator` chains arrivals instead of scheduling the whole trace,
`sim.scaling.Scaler` runs the wake-ups many decisions ask for at one instant as one event
and skips a decision that would repeat the last one, an endpoint's held requests counted
as they change (`sim/held.py`), the policies' snapshots kept while equal
(`sim/load_views.py`), P/D's parked requests counted per instance and an instance's K/V
ingress use reused at one instant (`sim/pd.py`), the router queue's prompt tokens counted
as it changes (`sim/held.py`), FlexPipe's pipeline settings kept while the mean stage count
stays, a drain's router snapshots kept between its dispatches but the chosen endpoint's,
a staged step's end that schedules the next step at once, an instance's monitor reads in
one pass over its heads, its router fields in one call, FlexPipe's layer profile built
once and its CV window from the arrivals' tail, a machine's free GPUs as a set test)
are replaced here by the plain versions;
every number of the result must stay the same. The plain counts also check the kept ones
at every read.
"""

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from surge.policy.autoscale import AutoscaleState, InstanceLoad, PoolLoad, decide
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.blitzscale import pd
from surge.policy.flexpipe.groups import pipeline_autoscale
from surge.policy.flexpipe.system import arrivals_in_window
from surge.policy.router import Endpoint
from surge.policy.systems import system_config
from surge.sim import batching, pools, scaling, simulator
from surge.sim.cluster_state import ClusterState
from surge.sim.costs import CostModel
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop, Priority
from surge.sim.flexpipe import FlexPipe
from surge.sim.flexpipe_sizes import layer_profile
from surge.sim.held import RouterQueue
from surge.sim.instance import Instance
from surge.sim.metrics import summarize
from surge.sim.pd import PdPool
from surge.sim.request import SimRequest
from surge.sim.serving_engine import ServingEngine
from surge.sim.settings import SimSettings
from surge.sim.simulator import simulate
from surge.sim.world import KEY_STRIDE
from surge.traces.gamma import gamma_trace


def _plain_at(self, pool, time_s):
    self.world.loop.schedule(
        time_s, Priority.CONTROL, 2 * KEY_STRIDE + pool.index, lambda: self.autoscale(pool)
    )


def _plain_arrivals(self):
    for req in self.requests:
        self.world.loop.schedule(
            req.arrival_s, Priority.ARRIVAL, req.id, lambda req=req: self.router.arrive(req)
        )


class _FreshSnapshots:
    """`load_views.Snapshots` that builds every snapshot anew."""

    def __init__(self, make):
        self.make = make

    def get(self, endpoint_id, fields):
        return self.make(endpoint_id, *fields)

    def each(self, endpoints, fields_of):
        return [self.make(e.id, *fields_of(e)) for e in endpoints]

    def prune(self, live):
        pass


def _recounted(self: ServingEngine) -> int:
    """The held requests summed over the heads' queues, checked against the kept count."""
    n = sum(len(h.waiting) + len(h.prefilling) + len(h.running) for h in self.heads)
    assert n == self.heads[0].held.n, (self.id, n, self.heads[0].held.n)
    _prompts_recounted(self)
    return n


def _prompts_recounted(self: ServingEngine) -> int:
    """The prompt tokens of the heads' waiting and prefilling requests without a first
    token, summed anew and checked against the kept sum."""
    queued = [r for h in self.heads for r in (*h.waiting, *h.prefilling)]
    tokens = sum(r.input_tokens for r in queued if r.first_token_s < 0)
    assert tokens == self.heads[0].held.prompt_tokens, (self.id, tokens)
    return tokens


def _pd_held_recounted(self: PdPool, inst) -> int:
    """`PdPool.held` with the requests parked on `inst` counted anew, checked against the
    kept count."""
    parked = sum(1 for s, _ in self.parked if s is inst)
    assert parked == self.parked_on.get(inst.id, 0), inst.id
    return inst.outstanding + inst.reserved + parked


_ingress_kept = PdPool.ingress_usage


def _ingress_checked(self: PdPool, inst) -> float:
    """`PdPool.ingress_usage` (reused at one instant) checked against the sum anew."""
    usage = _ingress_kept(self, inst)
    assert usage == pd.ingress_usage(self.ingress.get(inst.id, ()), self.clock()), inst.id
    return usage


_queue_kept = RouterQueue.prompt_tokens.fget


def _queue_recounted(self: RouterQueue) -> int:
    """The router queue's prompt tokens without a first token summed anew, checked against
    the kept sum."""
    tokens = sum(r.input_tokens for r in self if r.first_token_s < 0)
    assert tokens == _queue_kept(self), tokens
    return tokens


def _plain_pipeline_autoscale(self: FlexPipe, pool, base):
    """`FlexPipe.autoscale_settings` built anew at every decision."""
    stages = [len(self.spans[i.id]) for i in pool.instances if i.id in self.spans]
    if not self.enabled or not stages:
        return base
    return pipeline_autoscale(base, sum(stages) / len(stages))


_send_kept = pools.Requests._send


def _send_checked(self: pools.Requests, req, eps, snapshot, start):
    """`Requests._send` with the snapshot a drain kept between its dispatches checked
    against every endpoint's read anew."""
    pool = self.pools[eps[0].pool_key]
    assert eps == pool.endpoints()
    fresh = [
        Endpoint(e.id, pool.held(e), e.max_batch, e.speed, e.route_target, e.micro_batches)
        for e in eps
    ]
    assert snapshot == fresh
    return _send_kept(self, req, eps, snapshot, start)


_monitor_kept = ServingEngine.monitor_reads


def _monitor_checked(self: ServingEngine) -> tuple[float | None, float, float]:
    """`ServingEngine.monitor_reads` (one pass over the heads) checked against the
    properties read one by one, as `pool_load` read them."""
    kept = _monitor_kept(self)
    assert kept == (self.idle_since_s, self.decode_tokens_per_s, self.kv_tokens), self.id
    return kept


_route_kept = Instance.route_fields


def _route_checked(self: Instance) -> tuple:
    """`Instance.route_fields` checked against the properties."""
    kept = _route_kept(self)
    plain = (self.outstanding + self.reserved, self.max_batch, self.speed)
    assert kept == (*plain, self.route_target, self.micro_batches), self.id
    return kept


_window_kept = FlexPipe._window


def _window_checked(self: FlexPipe, pool) -> tuple[float, ...]:
    """`FlexPipe._window` (the pool's tail only) checked against every arrival filtered."""
    kept = _window_kept(self, pool)
    assert self.settings is not None
    assert kept == arrivals_in_window(tuple(pool.arrivals_s), self.world.loop.now_s, self.settings)
    return kept


def _plain(m: pytest.MonkeyPatch) -> None:
    m.setattr(scaling.Scaler, "_at", _plain_at)
    m.setattr(scaling.Scaler, "_repeats", lambda *a: False)
    m.setattr(simulator.Simulation, "_schedule_arrivals", _plain_arrivals)
    m.setattr(ServingEngine, "outstanding", property(_recounted))
    m.setattr(ServingEngine, "pending_prompt_tokens", property(_prompts_recounted))
    m.setattr(pools, "Snapshots", _FreshSnapshots)
    m.setattr(PdPool, "held", _pd_held_recounted)
    m.setattr(PdPool, "ingress_usage", _ingress_checked)
    m.setattr(RouterQueue, "prompt_tokens", property(_queue_recounted))
    m.setattr(FlexPipe, "autoscale_settings", _plain_pipeline_autoscale)
    m.setattr(pools.Requests, "_send", _send_checked)
    m.setattr(batching, "STAGED_STEP_SHORTCUT", False)
    m.setattr(ServingEngine, "monitor_reads", _monitor_checked)
    m.setattr(Instance, "route_fields", _route_checked)
    m.setattr(FlexPipe, "_window", _window_checked)
    m.setattr(FlexPipe, "_profile", lambda self, model: layer_profile(self.world, model))
    m.setattr(ClusterState, "has_free", lambda self, machine: bool(self.free_on(machine)))


def _outcome(system: str, trace, models: tuple[str, ...]) -> tuple[str, int]:
    name, _, capped = system.partition("+")
    variant = system_config(name)
    if capped:  # one instance per decision, after a stable window: repeats at one instant act
        knobs = dict(max_scale_out_per_decision=1, upscale_delay_s=0.5, downscale_delay_s=1.0)
        variant = dataclasses.replace(
            variant, autoscale=dataclasses.replace(variant.autoscale, **knobs)
        )
    settings = SimSettings("lambdascale-testbed1", models, name)
    res = simulate(trace, settings, system=variant)
    summary = summarize(res, settings)
    events = summary.pop("events")
    summary.pop("wall_s")
    every = {
        "summary": summary,
        "first_token_s": res.first_token_s.tolist(),
        "done_s": res.done_s.tolist(),
        "gpu_changes": res.gpu_changes,
        "scale_events": res.scale_events,
        "samples": res.samples,
    }
    return json.dumps(every, sort_keys=True), events


@pytest.mark.parametrize(
    ("system", "num_models"),
    [
        ("blitzscale", 1),
        ("lambdascale", 1),
        ("flexpipe", 1),
        ("serverlessllm", 3),
        ("lambdascale+capped", 1),
        ("paraserve", 1),
    ],
)
def test_shortcuts_give_the_plain_paths_results(monkeypatch, system, num_models):
    trace = gamma_trace(40.0, 4.0, 60.0, seed=3, input_tokens=256, output_tokens=32)
    trace = dataclasses.replace(trace, model_index=np.arange(trace.num_requests) % num_models)
    models = (f"llama2-7b*{num_models}",) if num_models > 1 else ("llama2-7b",)
    fast, fast_events = _outcome(system, trace, models)
    with monkeypatch.context() as m:
        _plain(m)
        plain, plain_events = _outcome(system, trace, models)
    assert json.loads(fast)["summary"]["finished"] == trace.num_requests
    assert fast == plain
    assert fast_events <= plain_events


def test_a_decision_that_changes_nothing_is_a_fixed_point():
    rng = np.random.default_rng(0)
    settings = AutoscaleSettings(
        target_ongoing_requests=4.0, upscale_delay_s=1.0, downscale_delay_s=2.0, keep_alive_s=5.0
    )
    fixed = 0
    for _ in range(2000):
        now = float(rng.uniform(10, 20))
        loads = tuple(
            InstanceLoad(
                i,
                int(rng.integers(0, 3)) * int(rng.integers(0, 2)),
                bool(rng.integers(0, 4) == 0),
                float(now - rng.uniform(0, 8)) if rng.integers(0, 2) else None,
            )
            for i in range(int(rng.integers(0, 4)))
        )
        loads = tuple(
            dataclasses.replace(i, idle_since_s=None) if i.outstanding else i for i in loads
        )
        load = PoolLoad(now, int(rng.integers(0, 20)), loads)
        state = AutoscaleState(
            float(now - rng.uniform(0, 2)) if rng.integers(0, 2) else None,
            float(now + rng.uniform(-1, 1)) if rng.integers(0, 2) else None,
        )
        first = decide(load, settings, state)
        if first.scale_out or first.release:
            continue
        fixed += 1
        assert decide(load, settings, first.state) == first
    assert fixed > 200


def test_a_decision_is_repeated_only_while_its_inputs_stay_the_same():
    trace = gamma_trace(20.0, 1.0, 5.0, seed=1, input_tokens=64, output_tokens=4)
    sim = simulator.Simulation(trace, SimSettings("lambdascale-testbed1", ("llama2-7b",), "ideal"))
    pool = sim.pools[(0, "both")]
    sim.scaler.scale_out(pool, 1, warm=True)
    assert sim.scaler.autoscale(pool) is False
    assert sim.scaler.autoscale(pool) is True  # same instant, nothing changed
    pool.queue.extend(sim.requests[:40])
    assert sim.scaler.autoscale(pool) is False  # the queue grew: decide again
    assert len(pool.instances) > 1


def test_the_held_count_follows_every_change_of_a_pipelines_heads():
    """`sim/held.py`: requests in, admitted, prefilled, finished, taken away and drained
    from a two-micro-batch pipeline; the kept count is the heads' sum at every step."""
    loop = EventLoop()
    spec = EngineSpec(CostModel(1e-3, 1e-5, 1e-3, 1e-5, num_layers=8), "both", 16, 10**6, 10**6)
    eng = ServingEngine(0, loop, spec, lambda e, r: None, lambda e, r: None)
    eng.set_micro_batches(2)
    seen = []
    for k in range(12):
        req = SimRequest(k, 0, 0.01 * k, 256, 5 + k)
        loop.schedule(req.arrival_s, Priority.ARRIVAL, k, lambda r=req: eng.submit(r))
    for k in range(40):
        loop.schedule(0.005 * k, Priority.CONTROL, k, lambda: seen.append(_recounted(eng)))
    loop.run(until_s=0.09)
    assert max(seen) > 0 and _recounted(eng) > 0
    taken = eng.take_waiting(2)
    assert taken and _recounted(eng) == eng.outstanding
    eng.drain()
    assert eng.outstanding == _recounted(eng) == 0


def test_a_kept_ingress_use_is_reused_only_for_the_same_hand_offs():
    """`PdPool.ingress_usage` reuses its last sum while the same hand-offs are in the
    window: one expiring as another is sent (as many in it) is a new sum."""
    now = [0.0]
    pool = PdPool(pd.PdSettings(), pd.PdTargets(), False, lambda: now[0])
    inst = SimpleNamespace(id=1)
    pool.handed(inst, 0.1)  # type: ignore[arg-type]
    now[0] = 0.5
    first = pool.ingress_usage(inst)  # type: ignore[arg-type]
    now[0] = 1.9
    assert pool.ingress_usage(inst) == first  # type: ignore[arg-type]
    now[0] = 2.1
    pool.handed(inst, 0.3)  # type: ignore[arg-type]
    now[0] = 2.2  # the first left the window, the second came: one in it either way
    assert pool.ingress_usage(inst) == pd.ingress_usage([(2.1, 0.3)], 2.2) != first  # type: ignore[arg-type]


def test_the_router_queue_counts_its_prompts_through_every_change():
    """`held.RouterQueue`: each way in or out keeps the prompt tokens of the requests
    without a first token equal to their sum."""
    reqs = [SimRequest(k, 0, 0.0, 100 + k, 4) for k in range(8)]
    for req in reqs[::3]:
        req.first_token_s = 1.0  # requeued after its first token: not the monitor's
    queue = RouterQueue(reqs[:2])
    queue.append(reqs[2])
    queue.appendleft(reqs[3])
    queue.extend(reqs[4:6])
    queue.extendleft(reqs[6:])
    queue += []
    assert queue.prompt_tokens == _queue_recounted(queue) > 0
    for take in (queue.popleft, queue.pop, lambda: queue.remove(reqs[4])):
        take()
        assert queue.prompt_tokens == _queue_recounted(queue)
    with pytest.raises(NotImplementedError):
        queue.insert(0, reqs[0])
    queue.clear()
    assert queue.prompt_tokens == 0 and not queue
