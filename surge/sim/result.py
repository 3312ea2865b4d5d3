"""What a simulation run returns: per-request times and cluster time series.

In: filled in by the simulator. Out: a `SimResult` that `metrics.summarize` reduces to
the numbers of the comparison table and JSON.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from surge.sim.request import SimRequest


def _none_s() -> np.ndarray:
    return np.zeros(0)


@dataclass(frozen=True)
class Handoffs:
    """Per request, its latest P/D hand-off (BlitzScale §6.1: the prefill instance hands a
    prefilled request's K/V to a decode instance); -1 where it had none. The wait for its
    second token splits into parked_s -> handoff_s (no decode instance named: every one
    full, or one still loading), handoff_s -> kv_arrived_s (the K/V transfer),
    kv_arrived_s -> decode_joined_s (queued on the decode instance for a step boundary) and
    the decode steps after. A request decoded in place has all three at one time."""

    parked_s: np.ndarray = field(default_factory=_none_s)
    """When its prefill instance parked it (its prefill done) to wait for a decode one."""
    parked_without_decode: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    """True where no decode instance served when it parked."""
    handoff_s: np.ndarray = field(default_factory=_none_s)
    """When its decode instance was named and its K/V began to move."""
    kv_arrived_s: np.ndarray = field(default_factory=_none_s)
    """When its K/V landed on the decode instance."""
    decode_joined_s: np.ndarray = field(default_factory=_none_s)
    """When it joined the decode instance's decode batch (its first decode step there)."""


def handoffs_of(requests: Sequence[SimRequest]) -> Handoffs:
    """The `Handoffs` of a run's requests (in id order) at its end."""

    def times(name: str) -> np.ndarray:
        return np.array([getattr(r, name) for r in requests], dtype=float)

    return Handoffs(
        parked_s=times("parked_s"),
        parked_without_decode=np.array([r.parked_without_decode for r in requests], bool),
        handoff_s=times("handoff_s"),
        kv_arrived_s=times("kv_arrived_s"),
        decode_joined_s=times("decode_joined_s"),
    )


@dataclass
class SimResult:
    """Raw outcome of one run."""

    system: str
    """System simulated."""
    model_names: tuple[str, ...]
    """Model of each model index."""
    arrival_s: np.ndarray
    """Per request: arrival."""
    first_token_s: np.ndarray
    """Per request: first token (-1 if never)."""
    done_s: np.ndarray
    """Per request: completion (-1 if never)."""
    output_tokens: np.ndarray
    """Per request: tokens generated."""
    model_index: np.ndarray
    """Per request: index into model_names."""
    gpu_changes: list[tuple[float, float]] = field(default_factory=list)
    """(time, GPUs allocated after the change)."""
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    """(time, GPUs allocated, host-cache bytes), every sample interval."""
    scale_events: list[tuple[float, str, str, int]] = field(default_factory=list)
    """(time, model, kind, count): kind is scale-out, release, mutate, pipeline,
    consolidate (a ParaServe group became `count` instances) or refactor (a FlexPipe
    group changed its stages)."""
    cache_hits: int = 0
    """Instance loads served from host memory."""
    cache_misses: int = 0
    """Instance loads from SSD or the remote registry."""
    network_loads: int = 0
    """Instance loads from GPU peers (multicast)."""
    hot_requests: int = 0
    """Requests routed at once to a serving endpoint."""
    clipped_requests: int = 0
    """Requests clipped to their model's context."""
    end_s: float = 0.0
    """Virtual time at which the run stopped."""
    num_events: int = 0
    """Events the loop ran."""
    wall_s: float = 0.0
    """Wall-clock seconds of the run."""
    cache_lifetimes_s: list[float] = field(default_factory=list)
    """How long each evicted host-cache entry stayed (λScale Fig. 2)."""
    live_batches: list = field(default_factory=list)
    """BlitzScale live scaling: one `sim.live_scaling.LiveRecord` per cooperative batch."""
    decoded_in_place: list[int] = field(default_factory=list)
    """P/D: ids of requests decoded on the instance that prefilled them (no decode
    instance serving or loading then: `policy.blitzscale.handoff.handoff_target`); their
    steps share it with prefill, so their TBT is slower than a hand-off's."""
    live_woken: int = 0
    """Live looks made when a block landed that a pending zigzag batch waited for (§5.2
    (2) preemption), not at the poll."""
    prefetches: int = 0
    """ParaServe §5: members whose node prefetched the rest into host memory while their
    group loaded and served (`sim.prefetch`)."""
    prefetch_hits: int = 0
    """Consolidating members that loaded a prefetched rest from host memory."""
    dispatched_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per request: when the router first gave it to an endpoint (-1 if never)."""
    endpoint: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Per request: the endpoint (instance id) it first went to (-1 if none)."""
    decode_instance: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Per request: the instance (id) it decoded on last, any system (-1 if none)."""
    handoffs: Handoffs = field(default_factory=Handoffs)
    """Per request: its P/D hand-off's times (`Handoffs`)."""
    endpoints_up: dict[int, tuple[float, int]] = field(default_factory=dict)
    """Per endpoint (instance id): when it began serving and its workers (pipeline stages):
    with `dispatched_s` and `endpoint`, a per-request timeline (benchmarks'
    `emulation/flexpipe_timeline.py` sets it beside the emulated runtime's)."""
