"""BlitzScale live scaling (§4, §5.2): who a live target cooperates with and which waiting
requests it takes (`live_scaling.LiveScalingState.look` asks).

Who may cooperate (`cooperating`): the instances that take new prefills, under P/D the
prefill ones only (see `live_scaling`'s docstring, §5.2).
Who the partner is (`pair_with`): BlitzScale §5.2 pairs each new instance with an
*overloaded* one ("for each overloaded instance, we will identify an instance in the
chain"; "Live autoscale protocol with paired instances ... a new instance (inst.1) to
offload computations from an overloaded instance (inst.0)"; §4 Fig. 7 (d): "When inst.0
becomes overloaded ... we redirect all requests from inst.0 to inst.1 ... it forwards the
activation back to inst.0 to process the remaining layers"). So the target pairs, when it
first needs to live-scale (§5.2 criterion (1), the SLO check), with the cooperating
instance that has the most outstanding requests (ties to the lowest id) and is not the
partner of another live target (each overloaded instance gets its own), and keeps it while
it cooperates (a pair, not a choice per batch); a target with no free partner declines
(`unpaired`) and loads stop-the-world. The paper does not quantify "overloaded": the most
outstanding requests is our reading. Until 2026-11-29 every batch ran on the *least* loaded
source, unpaired (`LiveSettings.least_loaded`, the counterfactual).
What it takes (`takes_from`; §5.2 step (1): "we redirect all queued requests from inst.0
to it ... All new requests to inst.0 are also redirected to inst.1"): the requests queued
on its partner's engine that have not started and the router's queue (new requests no
instance holds yet), oldest first (`Waiting.source` says where each one is); not those
queued on other instances (with `least_loaded`: every source's, as before).
Pure and deterministic.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LiveSource:
    """A serving instance the target may help."""

    id: int
    """Stable id (ties go to the lowest)."""
    outstanding: int
    """Requests on it or on their way to it."""
    prefills: bool = True
    """It takes new prefills (under P/D: a prefill instance): it may cooperate
    (`cooperating`) and counts in the SLO check."""


@dataclass(frozen=True)
class Waiting:
    """A request that has not started."""

    arrival_s: float
    prompt_tokens: int
    source: int | None = None
    """Where it waits: None, the router's queue; else the id of the source whose engine
    holds it queued, not started (§4 step 1: those are redirected too)."""


def redirect_order(waiting: Sequence[Waiting]) -> tuple[int, ...]:
    """Indices of `waiting` in the order a live target takes them (§4 step 1: the router's
    queue and the sources' queued requests alike): the oldest arrival first, ties in the
    given order. Without this the runtime took the router's queue alone and a request
    already routed to the source waited for the source's next step (requests 8-10 of the
    emulated §6.1 run, +0.28 s each, docs/emulation.md)."""
    return tuple(sorted(range(len(waiting)), key=lambda i: waiting[i].arrival_s))


def cooperating(
    sources: Sequence[LiveSource], decode_partners: bool = False
) -> tuple[LiveSource, ...]:
    """The sources a live target may run a batch's last layers on: those that take new
    prefills (under P/D the prefill instances; see the module docstring, §5.2); every one
    with `decode_partners` (the counterfactual)."""
    return tuple(x for x in sources if x.prefills or decode_partners)


def pair_with(
    sources: Sequence[LiveSource], current: int | None, taken: frozenset[int] = frozenset()
) -> int | None:
    """The target's partner among the cooperating `sources` (BlitzScale §5.2, see the
    module docstring): `current` while it still cooperates, else the one with the most
    outstanding requests (ties to the lowest id) that is not in `taken` (other targets'
    partners); None when every one is taken."""
    if current is not None and any(x.id == current for x in sources):
        return current
    free = [x for x in sources if x.id not in taken]
    if not free:
        return None
    return max(free, key=lambda x: (x.outstanding, -x.id)).id


def takes_from(waiting: Sequence[Waiting], queues: frozenset[int] | None) -> tuple[int, ...]:
    """Indices of `waiting` a target may take, oldest first (`redirect_order`): the
    router's queue and the requests queued on the sources in `queues` (its partner; None:
    every source). BlitzScale §5.2 step (1): "we redirect all queued requests from inst.0
    to it"."""
    order = redirect_order(waiting)
    if queues is None:
        return order
    return tuple(i for i in order if waiting[i].source is None or waiting[i].source in queues)
