"""Autoscaler: how many instances a model (or one role of it) should have now.

In: a `PoolLoad` (requests waiting at the router and, per instance, its outstanding
requests, whether it is still loading, and since when it has been idle), the pool's
`AutoscaleSettings` (`policy.autoscale_settings`) and the `AutoscaleState` the previous
decision returned. Out: a `ScaleDecision`: how many instances to add, which idle instances
to release, and the state to pass to the next decision. `surge serve`'s controller and the
simulator both call `decide` on every tick; neither adds rules of its own.

Rules (a concurrency target, as Knative and the papers' load monitors use; the knob names
are Ray Serve's, the only vocabulary surge uses):
- desired = ceil(outstanding / target_ongoing_requests), at least `min_serving` (1; a
  P/D deployment 2, a prefill and a decode instance: `policy.blitzscale.pd.serving_floor`)
  while any request is outstanding, within [min_replicas, max_replicas]. Instances still
  loading count as capacity, so a slow load is not answered by ever more scale-outs
  unless the backlog keeps growing (the over-provisioning BlitzScale §6.2 observes for
  ServerlessLLM comes from the backlog, not from the rule).
- Load monitor (BlitzScale §5.3: "records the serving loads with tokens per second and
  KVCache usage globally. When the average load surpasses a pre-defined upper bound, we
  allocate sufficient instances to meet that demand"): desired is also at least
  ceil(prefill + decode), in instances' worth of load: prefill, the prompt tokens of the
  pool's requests still waiting for their first token over `prefill_within_s` (the TTFT
  SLO: the prefill tokens/s they need) per `target_prefill_tokens_per_s`; decode, the
  larger of the pool's generated tokens/s per `target_tokens_per_s` and its summed KV use
  per `target_kv_usage` (the same instances). Each term counts only when its bound is
  set. The body measures the loads; `policy.blitzscale.monitor.profiled` derives the
  bounds from a model's cost and SLO (`profile_bounds`). `count_in_flight` False: the
  requests in flight size nothing (BlitzScale's monitor counts tokens and KV only) and
  there is no panic.
- Stable window (Knative): a scale-out happens once the load has asked for more
  instances for `upscale_delay_s`, at once when the pool is at zero (the activator) or
  in panic.
- Panic window (Knative): outstanding >= panic_threshold x target x max(1, instances)
  starts panic for `panic_window_s`; in panic nothing is released.
- Scale-down: an instance idle for `downscale_delay_s` (BlitzScale §5.3: 2 s, the
  timeout-based scale-down once the load falls below what fewer instances carry) may be
  released while the pool stays >= desired, the longest-idle first (ties: lowest id);
  the last instance stays until it has idled `keep_alive_s` (scale to zero,
  ServerlessLLM / λScale keep-alive).
- Always-ready floor (FlexPipe §9.1: it "maintains only 30% of peak capacity as
  always-ready resources, with remaining capacity allocated through dynamic scaling";
  §9.6: "30% of historical peak capacity"): with `always_ready_fraction` f > 0, desired is
  at least ceil(f x the most instances the pool has held so far), the peak kept in the
  state. 0 (every system but FlexPipe) = no floor beyond `min_replicas`. The peak lapses
  once the pool has had no request for `forget_peak_after_idle_s` (surge's, not the
  paper's: its production pools never idle, §9.6): the floor goes with it and the idle
  pool scales to zero, as a serverless deployment must; the next load starts a new peak.
Pure and deterministic: no clock, the caller passes `now_s` and the previous state. A
decision that adds and releases nothing is a fixed point: fed its own state with the same
load and settings it returns itself (the simulator skips such repeats at one instant).
"""

import math
from dataclasses import dataclass

from surge.policy.autoscale_restart import Restart
from surge.policy.autoscale_settings import AutoscaleSettings


@dataclass(frozen=True)
class AutoscaleState:
    """What the autoscaler remembers of one pool between decisions."""

    want_since_s: float | None = None
    """Since when the load has asked for more instances (stable window); None = it does not."""
    panic_until_s: float | None = None
    """Panic lasts until then; None = never panicked."""
    peak_instances: int = 0
    """The most instances the pool has held (the always-ready floor's historical peak)
    since it last idled `forget_peak_after_idle_s`; 0 = none (forgotten, or never used)."""
    restart: Restart | None = None
    """What a controller restart carried (`policy.autoscale_restart`); None once a request came."""

    def in_panic(self, now_s: float) -> bool:
        return self.panic_until_s is not None and now_s < self.panic_until_s


@dataclass(frozen=True)
class InstanceLoad:
    """One instance as the autoscaler sees it."""

    instance_id: int
    """Stable id (ties are broken by it)."""
    outstanding: int
    """Requests queued at or running on it."""
    loading: bool
    """True while its weights are still arriving."""
    idle_since_s: float | None
    """When it last became idle (no outstanding request); None if busy."""
    tokens_per_s: float = 0.0
    """Tokens it generated per second over the body's trailing window (the load monitor)."""
    kv_usage: float = 0.0
    """Fraction of its KV cache in use, 0..1 (the load monitor)."""


RATE_WINDOW_S = 2.0
"""Each body's load monitor measures tokens/s over this trailing window (BlitzScale's 2 s
decision scale): the autoscaler's `InstanceLoad.tokens_per_s` and the P/D monitor's alike."""


@dataclass(frozen=True)
class PoolLoad:
    """The load of one pool (a model, or one role of it under P/D disaggregation)."""

    now_s: float
    """Current time, seconds."""
    queued: int
    """Requests waiting at the router, or on endpoints that are not instances (execution
    pipelines), for any instance."""
    instances: tuple[InstanceLoad, ...]
    """Every instance of the pool, loading or serving."""
    pending_prefill_tokens: int = 0
    """Prompt tokens of the pool's requests without a first token yet, wherever they wait
    or prefill (the load monitor's prefill load)."""

    @property
    def outstanding(self) -> int:
        """Every request of the pool not yet finished."""
        return self.queued + sum(i.outstanding for i in self.instances)

    @property
    def tokens_per_s(self) -> float:
        """Tokens the pool generates per second."""
        return sum(i.tokens_per_s for i in self.instances)

    @property
    def kv_usage(self) -> float:
        """The instances' KV-cache use, summed (in instances' worth of KV cache)."""
        return sum(i.kv_usage for i in self.instances)


@dataclass(frozen=True)
class ScaleDecision:
    """What to do now."""

    desired: int
    """Instances the pool should have."""
    scale_out: int
    """Instances to add now."""
    release: tuple[int, ...]
    """Idle instances to release now, in order."""
    state: AutoscaleState
    """Pass this to the next decision of the pool."""
    wake_at_s: float | None = None
    """The next time a decision could differ with no new load (an idle instance's delay
    or the stable window runs out); None = only new load changes it. Event-driven callers
    (the simulator) schedule a decision then; tick-driven ones may ignore it."""


ROUND_SLACK = 1e-9
"""Instances' worth the ceilings round away (the load monitor's, the always-ready floor's):
an instance at exactly its bound, or a fraction of the peak that is whole, measured in
floats, must not ask for one more."""


def monitor_instances(load: PoolLoad, settings: AutoscaleSettings) -> int:
    """Instances the load monitor asks for (module docstring): ceil(prefill + decode load),
    each in instances' worth; 0 when no bound is set."""
    prefill = 0.0
    if settings.target_prefill_tokens_per_s is not None and settings.prefill_within_s:
        need = load.pending_prefill_tokens / settings.prefill_within_s  # tokens/s
        prefill = need / settings.target_prefill_tokens_per_s
    decode = 0.0
    if settings.target_tokens_per_s is not None:
        decode = load.tokens_per_s / settings.target_tokens_per_s
    if settings.target_kv_usage is not None:
        decode = max(decode, load.kv_usage / settings.target_kv_usage)
    return math.ceil(prefill + decode - ROUND_SLACK)


def desired_instances(load: PoolLoad, settings: AutoscaleSettings) -> int:
    """Instances needed for `load`: its requests in flight (when they count) and the load
    monitor's terms, within the settings' bounds."""
    outstanding = load.outstanding
    want = 0
    if settings.count_in_flight:
        want = math.ceil(outstanding / settings.target_ongoing_requests)
    want = max(want, monitor_instances(load, settings))
    if outstanding > 0:
        want = max(want, settings.min_serving)
    want = max(want, settings.min_replicas)
    if settings.max_replicas is not None:
        want = min(want, settings.max_replicas)
    return want


def ready_floor(peak_instances: int, settings: AutoscaleSettings) -> int:
    """Instances kept always ready for a pool that has held `peak_instances` at most
    (FlexPipe §9.1 / §9.6: a fraction of the historical peak), within `max_replicas`."""
    floor = math.ceil(settings.always_ready_fraction * peak_instances - ROUND_SLACK)
    if settings.max_replicas is not None:
        floor = min(floor, settings.max_replicas)
    return floor


def idle_since(load: PoolLoad) -> float | None:
    """Since when the pool has had no request in flight: when its last busy instance went
    idle, if nothing waits and every instance is idle; None while busy, loading, or with no
    instance (nothing tells then)."""
    if load.queued or not load.instances:
        return None
    times = [
        i.idle_since_s
        for i in load.instances
        if not i.loading and i.outstanding == 0 and i.idle_since_s is not None
    ]
    return max(times) if len(times) == len(load.instances) else None


def instances_quiet(load: PoolLoad) -> tuple[tuple[int, float], ...]:
    """(instance id, since when it has had no request) of the pool's instances known one by
    one: a busy instance is quiet from now (its requests end with the controller), an idle
    one since it went idle; a loading one is not known (it has served nothing yet)."""
    out = []
    for i in load.instances:
        if i.outstanding > 0:
            out.append((i.instance_id, load.now_s))
        elif not i.loading and i.idle_since_s is not None:
            out.append((i.instance_id, i.idle_since_s))
    return tuple(sorted(out))


def peak_lapses_at(
    load: PoolLoad, settings: AutoscaleSettings, restart: Restart | None = None
) -> float | None:
    """When the idle pool's historical peak lapses (it has idled `forget_peak_after_idle_s`,
    since a carried `restart`'s quiet time); None while it is busy or the peak is kept for good."""
    since = idle_since(load) if restart is None else restart.quiet_since_s
    after = settings.forget_peak_after_idle_s
    return None if since is None or after is None else since + after


def decide(
    load: PoolLoad, settings: AutoscaleSettings, state: AutoscaleState = AutoscaleState()
) -> ScaleDecision:
    """The scale decision for `load` given the previous `state` (see module docstring)."""
    now = load.now_s
    outstanding = load.outstanding
    want = desired_instances(load, settings)
    have = len(load.instances)
    wake: list[float] = []
    restart = None if outstanding else state.restart  # a request ends a restart's carry
    # the idle pool's peak lapses, and held instances do not count again until load
    # returns (else the floor would rebuild the peak it keeps)
    lapse_s = peak_lapses_at(load, settings, restart)
    forgotten = lapse_s is not None and now >= lapse_s
    peak = 0 if forgotten else max(state.peak_instances, have)
    floor = ready_floor(peak, settings)
    if floor > want and have > want and lapse_s is not None:
        wake.append(lapse_s)  # the floor holds instances until the peak lapses
    want = max(want, floor)
    if restart is not None:  # the instances the old controller would still hold
        delays_s = (settings.downscale_delay_s, settings.last_keep_alive_s)
        held, until_s = restart.hold(now, *delays_s, settings.max_replicas)
        if held > want and until_s is not None:
            wake.append(until_s)
        want = max(want, held)
    panic_until = state.panic_until_s
    if (
        settings.panic_window_s > 0
        and settings.count_in_flight
        and outstanding > 0
        and outstanding
        >= settings.panic_threshold * settings.target_ongoing_requests * max(1, have)
    ):
        panic_until = now + settings.panic_window_s  # Knative panic mode
    panic = panic_until is not None and now < panic_until
    out = max(0, want - have)
    if settings.max_scale_out_per_decision is not None:
        out = min(out, settings.max_scale_out_per_decision)
    want_since = None
    if out > 0:
        since = now if state.want_since_s is None else state.want_since_s
        if not (have == 0 or panic or now - since >= settings.upscale_delay_s):
            # the stable window has not passed yet
            want_since = since
            wake.append(since + settings.upscale_delay_s)
            out = 0
    state = AutoscaleState(want_since, panic_until, peak, restart)
    release: list[int] = []
    if have > want and not panic:
        # a carried instance idles since its carried time (none idles longer)
        ids = [i.instance_id for i in load.instances]
        quiet_s = {} if restart is None else restart.quiet_for(ids)
        idle = sorted(
            (min(i.idle_since_s, quiet_s.get(i.instance_id, math.inf)), i.instance_id)
            for i in load.instances
            if not i.loading and i.outstanding == 0 and i.idle_since_s is not None
        )
        for since, iid in idle[: have - want]:
            left = have - len(release) - 1
            delay = settings.downscale_delay_s if left > 0 else settings.last_keep_alive_s
            if now - since >= delay:
                release.append(iid)
            else:
                wake.append(since + delay)
    elif have > want and state.panic_until_s is not None:
        wake.append(state.panic_until_s)
    return ScaleDecision(want, out, tuple(release), state, min(wake) if wake else None)
