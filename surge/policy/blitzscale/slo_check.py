"""BlitzScale §5.2's SLO check: would a stop-the-world scale-out make a queued request miss
its TTFT SLO?

In: what the serving body measured, as plain numbers with the time passed in: the queued
requests' arrival times, when requests left the queue for an instance (the drain rate),
the prefill spans of requests on the serving instances (the prefill time per token), and
when the new instance will hold every layer. Out: `needs_live_scaling` ("the necessity of
live autoscaling, i.e. when a stop-the-world scaling will cause SLO violation"): the
predicted TTFT of every queued request under normal routing (FIFO, the queue drains at
the measured rate until the new instance is whole, then one instance faster) against the
TTFT SLO. When it holds, requests stay on normal routing. Asked by
`live_scaling.LiveScalingState.look`; pure and deterministic.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from surge.errors import SurgeError

DRAIN_WINDOW_S = 2.0
"""Departures from the queue in this trailing window give its drain rate (BlitzScale's
monitor looks at the same 2 s)."""


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
