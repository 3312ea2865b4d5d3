"""BlitzScale live scaling decisions (§4, §5.2, Eq. 1): whether, on which schedule, and the
redistribution once the new instance is whole.

In: what the serving body measured on this run, as plain numbers with the time passed in:
the queued requests' arrival times, when requests left the queue for an instance, the
prefill spans of requests on the serving instances, and when each layer of the model
reached the new instance. Out:
- `needs_live_scaling`: the SLO check of §5.2 ("the necessity of live autoscaling, i.e.
  when a stop-the-world scaling will cause SLO violation"): the predicted TTFT of every
  queued request under normal routing (FIFO, the queue drains at the measured rate until
  the new instance is whole, then one instance faster) against the TTFT SLO. When it
  holds, requests stay on normal routing;
- `measured_load_ratio`: Eq. 1's Time_l on this run — the time one layer takes to reach
  the new instance (its block arrivals) over the time one layer of a batch takes to run
  (the serving instances' measured prefill time per token × the batch's tokens / L);
  the system's `live_load_ratio` until both are measured;
- `choose_schedule`: the zigzag ILP (`zigzag.solve_zigzag`) when it beats best effort on
  Eq. 1's predicted average latency, otherwise best effort;
- `plan_redistribution` (§5.2 step 3): once the new instance holds every layer, requests
  are spread evenly between it and the instances it helped.
Pure and deterministic; `runtime/scaleout/live.py` gathers the inputs and carries out
what these return.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.blitzscale.zigzag import ZigzagProblem, ZigzagSchedule, best_effort, solve_zigzag

DRAIN_WINDOW_S = 2.0
"""Departures from the queue in this trailing window give its drain rate (BlitzScale's
monitor looks at the same 2 s)."""
MAX_ILP_BATCHES = 64
"""Above this many batches the ILP is not tried (the paper solves "a dozen or so" in
< 40 ms; best effort is always feasible)."""
ILP_GAIN = 1e-9
"""The ILP must beat best effort by more than this (floating point) to be used."""


@dataclass(frozen=True)
class PrefillSpan:
    """One request's prefill on a serving instance: from the moment it was handed to the
    instance to its first token, and the tokens it prefilled."""

    start_s: float
    end_s: float
    num_tokens: int


def prefill_s_per_token(spans: Sequence[PrefillSpan]) -> float | None:
    """Seconds one prompt token takes to prefill (all L layers) on a serving instance:
    the time some prefill was running (the union of the spans, so requests batched into
    one step count the step once) over the tokens prefilled. Prefill time is about linear
    in the batched tokens (BlitzScale §5.2 "Coping with LLM"). None when nothing is
    measured yet."""
    good = sorted((s.start_s, s.end_s) for s in spans if s.end_s > s.start_s)
    tokens = sum(s.num_tokens for s in spans if s.end_s > s.start_s)
    if not good or tokens <= 0:
        return None
    busy, cur_start, cur_end = 0.0, good[0][0], good[0][1]
    for start, end in good[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return busy / tokens


def drain_rate_per_s(departures_s: Sequence[float], now_s: float) -> float | None:
    """Requests leaving the queue for an instance per second over the last
    `DRAIN_WINDOW_S` (None when none left in it)."""
    recent = [t for t in departures_s if now_s - DRAIN_WINDOW_S <= t <= now_s]
    if not recent:
        return None
    return len(recent) / DRAIN_WINDOW_S


@dataclass(frozen=True)
class SloCheck:
    """What the SLO check looks at, measured by the body at `now_s`."""

    now_s: float
    queued_arrivals_s: tuple[float, ...]
    """Arrival times of the requests waiting at the router, FIFO order."""
    ttft_slo_s: float
    drain_per_s: float | None
    """How fast the queue drains now (`drain_rate_per_s`); None: not measured yet."""
    prefill_s_per_request: float | None
    """A queued request's own prefill once it is on an instance (measured); None: unknown."""
    num_serving: int
    """Instances the queue drains into now (the new instance adds one when whole)."""
    whole_in_s: float | None = None
    """Predicted time until the new instance holds every layer (None: unknown, never)."""

    def __post_init__(self) -> None:
        if not self.ttft_slo_s > 0:
            raise SurgeError(f"TTFT SLO must be > 0 (got {self.ttft_slo_s})")
        if self.num_serving < 0:
            raise SurgeError("num_serving must be >= 0")


@dataclass(frozen=True)
class LiveDecision:
    """Whether to live-scale now, and the prediction it rests on."""

    live: bool
    worst_ttft_s: float
    """The largest predicted TTFT of a queued request under normal routing (inf: the
    queue does not drain at all)."""


def predicted_ttfts(check: SloCheck) -> tuple[float, ...]:
    """Each queued request's TTFT if nothing helps but stop-the-world scaling: FIFO, the
    k-th leaves the queue after k+1 departures at the measured drain rate — one
    instance's worth faster from the moment the new instance is whole — then prefills."""
    prefill = check.prefill_s_per_request or 0.0
    rate = check.drain_per_s
    if rate is None and check.prefill_s_per_request and check.num_serving:
        rate = check.num_serving / check.prefill_s_per_request  # idle instances, compute-bound
    out: list[float] = []
    for k, arrival in enumerate(check.queued_arrivals_s):
        waited = check.now_s - arrival
        if rate is None or rate <= 0:
            out.append(math.inf if rate is not None else waited + prefill)
            continue
        leave = (k + 1) / rate
        if check.whole_in_s is not None and leave > check.whole_in_s and check.num_serving:
            # From `whole_in_s` on the queue drains (n + 1) / n times faster.
            faster = rate * (check.num_serving + 1) / check.num_serving
            leave = check.whole_in_s + (k + 1 - check.whole_in_s * rate) / faster
        out.append(waited + leave + prefill)
    return tuple(out)


def needs_live_scaling(check: SloCheck) -> LiveDecision:
    """Live-scale only when some queued request would miss the TTFT SLO without it."""
    ttfts = predicted_ttfts(check)
    worst = max(ttfts, default=0.0)
    return LiveDecision(live=worst > check.ttft_slo_s, worst_ttft_s=worst)


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
class InstanceLoad:
    """A serving instance as the redistribution sees it."""

    index: int
    """Stable id (its age)."""
    outstanding: int
    capacity: int


@dataclass(frozen=True)
class Move:
    """Move `num_requests` of instance `from_index`'s requests to the new instance."""

    from_index: int
    num_requests: int


def plan_redistribution(olds: Sequence[InstanceLoad], new: InstanceLoad) -> tuple[Move, ...]:
    """§5.2 step 3: once the new instance holds every layer, requests are spread evenly
    between it and the old instances. Each old instance above the even share gives its
    excess (most loaded first, ties to the oldest) while the new one has room."""
    total = new.outstanding + sum(o.outstanding for o in olds)
    share = math.ceil(total / (len(olds) + 1))
    room = min(new.capacity - new.outstanding, share - new.outstanding)
    moves: list[Move] = []
    for o in sorted(olds, key=lambda o: (-o.outstanding, o.index)):
        n = min(o.outstanding - share, room)
        if n <= 0:
            continue
        moves.append(Move(o.index, n))
        room -= n
    return tuple(moves)
