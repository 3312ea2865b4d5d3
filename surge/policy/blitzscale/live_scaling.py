"""BlitzScale live scaling (§4, §5.2, Eq. 1): each look at the queue, what a live new
instance (the *target*) does, and the redistribution once it is whole.

In: `LiveSettings` (the model's layers, `live_batch`, the fallback Time_l, the TTFT SLO),
then one `LiveView` per look: the layers the target holds, the serving instances it may
help (the *sources*), the requests waiting that have not started, and what the body
measured on this run (seconds per layer reaching the target, a source's prefill seconds
per token, the queue's drain rate). Out, from `LiveScalingState.look`, one action:
- `Decline`: nothing to do (no source that prefills, no request, no layer), `max_in_flight` batches
  of this target are under way already, the §5.2 SLO check holds
  (`slo_check.needs_live_scaling`: every queued request meets its TTFT SLO under normal
  routing), or the schedule's next batch runs on the source alone (T_i = 0);
- `WaitForLayers`: the zigzag schedule's next batch needs more layers than the target
  holds (§5.2 "the delay won't waste GPU": the queue keeps being routed normally); the
  batch is *pending* and `wakes(held)` says when a layer that lands makes it runnable:
  the body looks again at once (§5.2 (2) preemption on layer arrival), not at its poll;
- `RunBatch`: prefill the waiting requests it names (`take`, oldest first:
  `redirect_order`) cooperatively, the first `split` layers on the target, the rest on
  `source` (its *partner*, `pair_with`), which then decodes them (under P/D they are
  handed to a decode instance as any prefill's).
Who cooperates (`cooperating`): the instances that take new prefills, under P/D the
prefill ones only. BlitzScale §5.2: live scaling pairs the new instance with an
*overloaded* instance ("the presence of overloaded instance since live autoscaling requires
a cooperation from it ... for each overloaded instance, we will identify an instance in the
chain"); under P/D it scales a prefill instance, "prefill-only serving (e.g., autoscaling a
prefill instance in P/D disaggregation)", whose K/V then goes to decode ones (§5.1 Fig. 11:
"Since the scale is live, the KVCache will be transferred to the decode instances"). A
decode instance running a batch's prefill layers would be an instance "that combine[s]
prefill and decode", whose live scaling §5.2 leaves "for future work". Fig. 8 (d)'s decode
instance is the *parameter* source of the multicast, not the live partner. Until
2026-11-29 any serving instance cooperated (on §6.1's 7B run 355 of 662 batches had a
decode source, which then decoded them behind its own prefills).
Who the partner is and what the target takes: `live_pair` (§5.2 paired instances).
A schedule (`choose_schedule`: the zigzag ILP of Eq. 1 when it beats best effort, else
best effort) covers the batches waiting when it starts; up to `max_in_flight` of its
batches are under way at once, so the target runs batch i+1's T layers while the source
runs batch i's S (the cross-batch overlap of Fig. 12b that Eq. 1's C2 schedules), with
Time_l measured on this run (`measured_load_ratio`); it starts afresh after a declined
look, and once Time_l is measured where the last one used the fallback. Best effort's
splits are clipped to the layers held and to L - 1.
`redistributed` (§5.2 step 3): once the target holds every layer and serves, the requests
queued on the instances it helped that have not started go back to the router, which
spreads them over every instance, the new one first.
`surge serve` (`runtime/scaleout/live.py`) and the simulator (`sim/live_scaling.py`)
build the view and carry the action out: `live_prefill` on real agents, the cost model in
virtual time. Pure and deterministic; no clock.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.blitzscale.live_pair import (
    LiveSource,
    Waiting,
    cooperating,
    pair_with,
    redirect_order,
    takes_from,
)
from surge.policy.blitzscale.slo_check import SloCheck, needs_live_scaling
from surge.policy.blitzscale.zigzag import ZigzagProblem, ZigzagSchedule, best_effort, solve_zigzag

MAX_ILP_BATCHES = 64
"""Above this many batches the ILP is not tried (the paper solves "a dozen or so" in
< 40 ms; best effort is always feasible)."""
ILP_GAIN = 1e-9
"""The ILP must beat best effort by more than this (floating point) to be used."""
LOOK_INTERVAL_S = 0.01
"""How long after a look that started no batch a live target looks again (seconds of the
serving clock; emulated seconds under emulation, virtual in the simulator). The paper scans
the queue when a layer lands (§5.2 (2)) and both bodies also look at once then and when a
receiver goes live; between those, requests arrive without telling the loop. One value for
both bodies: the runtime polled every 50 ms where the simulator looked every 10 ms, so its
live batches started up to 40 ms later (the emulated §6.1 run's first batch 1.104 vs
1.067 s)."""


@dataclass(frozen=True)
class LoadRatio:
    """Eq. 1's Time_l and whether it was measured on this run (False: the fallback)."""

    value: float
    measured: bool
    layer_load_s: float | None = None
    layer_exec_s: float | None = None


def layer_load_s(arrivals: Sequence[tuple[float, int]]) -> float | None:
    """Seconds per layer reaching the new instance, from its block arrivals (time, layers
    in the block) in arrival order: the layers after the first block over the time they
    took. None with fewer than two arrivals or no time between them."""
    if len(arrivals) < 2:
        return None
    elapsed = arrivals[-1][0] - arrivals[0][0]
    layers = sum(n for _, n in arrivals[1:])
    if elapsed <= 0 or layers <= 0:
        return None
    return elapsed / layers


def measured_load_ratio(
    load_s_per_layer: float | None,
    prefill_s_token: float | None,
    batch_tokens: int,
    num_layers: int,
    fallback: float,
) -> LoadRatio:
    """Time_l = layer load time / one layer's execution time for a batch of
    `batch_tokens` (prefill time per token × tokens / L); `fallback` (the system's
    `live_load_ratio`) until both are measured."""
    if load_s_per_layer is None or not prefill_s_token or batch_tokens < 1 or num_layers < 1:
        return LoadRatio(fallback, False, load_s_per_layer)
    exec_s = prefill_s_token * batch_tokens / num_layers
    return LoadRatio(load_s_per_layer / exec_s, True, load_s_per_layer, exec_s)


def choose_schedule(problem: ZigzagProblem) -> ZigzagSchedule:
    """The zigzag ILP's schedule when its Eq. 1 average latency beats best effort's,
    otherwise best effort (also when the problem is too large to solve in time)."""
    be = best_effort(problem)
    if problem.num_batches > MAX_ILP_BATCHES:
        return be
    zz = solve_zigzag(problem)
    return zz if zz.avg_latency < be.avg_latency - ILP_GAIN else be


@dataclass(frozen=True)
class LiveSettings:
    """How one target live-scales. Validated at construction."""

    num_layers: int
    """L: layers of the model."""
    live_batch: int
    """Requests per cooperative batch (`SystemConfig.live_batch`)."""
    fallback_load_ratio: float
    """Time_l until the run has measured it (`SystemConfig.live_load_ratio`)."""
    ttft_slo_s: float
    """The model's TTFT SLO (the §5.2 check)."""
    decode_partners: bool = False
    """Counterfactual: sources that do not prefill (P/D decode instances) cooperate too
    (`SystemConfig.live_decode_partners`)."""
    least_loaded: bool = False
    """Counterfactual (unsourced; surge before 2026-11-29): each batch's last layers run on
    the least loaded cooperating source, unpaired, and the target takes every source's
    queued requests (`SystemConfig.live_least_loaded`). Default: the paired overloaded
    instance (`pair_with`, BlitzScale §5.2)."""
    max_in_flight: int = 2
    """Batches of one target under way at once (started, first token not yet back). Two
    let the target run batch i+1's first layers while the source runs batch i's rest
    (Fig. 12b); one would run them strictly one after another."""

    def __post_init__(self) -> None:
        if self.num_layers < 1 or self.live_batch < 1 or not self.fallback_load_ratio > 0:
            raise SurgeError("live scaling needs >= 1 layer, live_batch >= 1, Time_l > 0")
        if self.max_in_flight < 1:
            raise SurgeError(f"max_in_flight must be >= 1 (got {self.max_in_flight})")
        if not self.ttft_slo_s > 0:
            raise SurgeError(f"TTFT SLO must be > 0 (got {self.ttft_slo_s})")


def redistributed(queued: Sequence[Waiting]) -> tuple[int, ...]:
    """§5.2 step 3, "requests will be re-distributed evenly between both instances": once
    the target holds every layer and serves, which of the requests queued on the instances
    it helped (not started) go back to the router, oldest first — every one: the router
    then spreads them over the instances by load, the new one (holding nothing) first.
    A request that has started stays where its K/V is (moving it would mean moving its
    K/V or prefilling it again). Under P/D too: left queued on the old prefill instance,
    the new one idles and the mutation rule takes it for decode (`pd_mutation.decide_mutation`:
    the emulated §6.1 run's remedy instance, docs/emulation.md)."""
    return redirect_order(queued)


@dataclass(frozen=True)
class LiveView:
    """One look at the queue, as the body measured it at `now_s`."""

    now_s: float
    held_layers: int
    """Layers 0..n-1 the target can run (its longest prefix of blocks)."""
    sources: tuple[LiveSource, ...]
    waiting: tuple[Waiting, ...]
    layer_load_s: float | None = None
    """Seconds per layer reaching the target on this run (`layer_load_s`); None: not yet."""
    prefill_s_per_token: float | None = None
    """A source's prefill seconds per prompt token (all L layers); None: not yet."""
    drain_per_s: float | None = None
    """Requests leaving the queue per second now (`slo_check.drain_rate_per_s`)."""
    in_flight: int = 0
    """This target's batches under way (started, first token not back yet)."""
    paired_elsewhere: frozenset[int] = frozenset()
    """Sources that are other live targets' partners (§5.2: one new instance per
    overloaded instance): this target does not pair with them."""


@dataclass(frozen=True)
class Decline:
    """Nothing runs cooperatively now; normal routing goes on."""

    reason: str
    """`idle` (no source, request or layer), `busy` (`max_in_flight` batches under way),
    `slo` (the SLO holds without help), `unpaired` (every cooperating source is another
    target's partner) or `source-alone` (the schedule's next batch has T_i = 0)."""


@dataclass(frozen=True)
class WaitForLayers:
    """Zigzag: the next batch waits until the target holds `layers` layers."""

    layers: int


@dataclass(frozen=True)
class RunBatch:
    """Prefill the waiting requests `take` names: `split` layers on the target, the rest
    on `source`."""

    source: int
    split: int
    take: tuple[int, ...]
    """Indices into the view's `waiting` of the batch's requests, oldest first
    (`redirect_order` of `takes_from`)."""
    queues: frozenset[int] | None
    """The sources whose queued requests the target takes (besides the router's queue):
    its partner's; None: every source's (`least_loaded`)."""
    planned_split: tuple[int, int]
    """(T_i, S_i) the schedule gave this batch before clipping."""
    index: int
    """The batch's position in its schedule."""
    schedule: str
    """`zigzag` or `best_effort`."""
    problem: ZigzagProblem
    """The Eq. 1 problem the schedule solved."""
    load_ratio: LoadRatio
    """Time_l of that problem and whether it was measured."""

    @property
    def num_requests(self) -> int:
        return len(self.take)


LiveAction = RunBatch | WaitForLayers | Decline


def pick_target(held_layers: Mapping[int, int]) -> int | None:
    """Of live targets (id -> layers held), the one a body with a single cooperative loop
    helps next: the most layers, ties to the lowest id; None when there is none."""
    if not held_layers:
        return None
    return max(held_layers, key=lambda n: (held_layers[n], -n))


class LiveScalingState:
    """The cooperative batches of one live target; `look` is its only input."""

    def __init__(self, settings: LiveSettings) -> None:
        self.settings = settings
        self.splits: list[tuple[int, int]] = []
        """What is left of the current schedule, next batch first."""
        self.schedule: ZigzagSchedule | None = None
        self.problem: ZigzagProblem | None = None
        self.ratio = LoadRatio(settings.fallback_load_ratio, False)
        self.num_schedules = 0
        """Schedules solved so far (each a fresh `ratio`)."""
        self.pending_layers: int | None = None
        """Layers the pending batch waits for (after `WaitForLayers`); None: none pends."""
        self.partner: int | None = None
        """The overloaded instance this target is paired with (`pair_with`); None: not yet."""

    def wakes(self, held_layers: int) -> bool:
        """Whether the target now holding `held_layers` layers makes the pending batch
        runnable: BlitzScale §5.2 (2) "whenever a new layer loads, we scan the pending
        queue and execute all requests that require that layer" — the body looks again
        at once instead of at its next poll."""
        return self.pending_layers is not None and held_layers >= self.pending_layers

    def look(self, view: LiveView) -> LiveAction:
        """What the target does now (see the module docstring)."""
        self.pending_layers = None
        s = self.settings
        held = min(view.held_layers, s.num_layers)
        if view.in_flight >= s.max_in_flight:
            return Decline("busy")
        partners = cooperating(view.sources, s.decode_partners)
        if not partners or not view.waiting or held < 1:
            return Decline("idle")
        if self._slo_holds(view, held):
            self.splits = []  # a fresh schedule if live scaling is needed again
            return Decline("slo")
        if s.least_loaded:  # the counterfactual: any source, every queue
            source, queues = min(partners, key=lambda x: (x.outstanding, x.id)).id, None
        else:  # §5.2: the paired overloaded instance and its queue
            self.partner = pair_with(partners, self.partner, view.paired_elsewhere)
            if self.partner is None:
                return Decline("unpaired")
            source, queues = self.partner, frozenset({self.partner})
        eligible = takes_from(view.waiting, queues)
        if not eligible:
            return Decline("idle")
        if not self.ratio.measured and view.layer_load_s is not None and view.prefill_s_per_token:
            self.splits = []  # Time_l is measured now: re-plan with it, not the fallback
        if not self.splits:
            self._plan(view, held, eligible)
        assert self.schedule is not None and self.problem is not None
        want = self.splits[0][0]
        if self.schedule.policy == "zigzag" and held < want < s.num_layers:
            self.pending_layers = want
            return WaitForLayers(want)
        index = len(self.schedule.splits) - len(self.splits)
        planned = self.splits.pop(0)
        split = min(want, held, s.num_layers - 1)
        if split < 1:
            return Decline("source-alone")
        return RunBatch(
            source=source,
            split=split,
            take=eligible[: s.live_batch],
            queues=queues,
            planned_split=planned,
            index=index,
            schedule=self.schedule.policy,
            problem=self.problem,
            load_ratio=self.ratio,
        )

    def _slo_holds(self, view: LiveView, held: int) -> bool:
        s = self.settings
        per_token = view.prefill_s_per_token
        mean_tokens = sum(w.prompt_tokens for w in view.waiting) / len(view.waiting)
        load_s = view.layer_load_s
        check = SloCheck(
            now_s=view.now_s,
            queued_arrivals_s=tuple(w.arrival_s for w in view.waiting),
            ttft_slo_s=s.ttft_slo_s,
            drain_per_s=view.drain_per_s,
            prefill_s_per_request=None if per_token is None else per_token * mean_tokens,
            num_serving=max(1, sum(1 for x in view.sources if x.prefills)),
            whole_in_s=None if load_s is None else (s.num_layers - held) * load_s,
        )
        return not needs_live_scaling(check).live

    def _plan(self, view: LiveView, held: int, eligible: tuple[int, ...]) -> None:
        """A fresh schedule for the batches this target may take now (`eligible`), on
        Time_l measured for the first."""
        s = self.settings
        first = [view.waiting[i] for i in eligible[: s.live_batch]]
        self.ratio = measured_load_ratio(
            view.layer_load_s,
            view.prefill_s_per_token,
            sum(w.prompt_tokens for w in first),
            s.num_layers,
            s.fallback_load_ratio,
        )
        self.problem = ZigzagProblem(
            num_layers=s.num_layers,
            load_ratio=self.ratio.value,
            num_batches=max(1, math.ceil(len(eligible) / s.live_batch)),
            resident_layers_at_start=held,
        )
        self.schedule = choose_schedule(self.problem)
        self.splits = list(self.schedule.splits)
        self.num_schedules += 1
