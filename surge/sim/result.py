"""What a simulation run returns: per-request times and cluster time series.

In: filled in by the simulator. Out: a `SimResult` that `metrics.summarize` reduces to
the numbers of the comparison table and JSON.
"""

from dataclasses import dataclass, field

import numpy as np


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
    endpoints_up: dict[int, tuple[float, int]] = field(default_factory=dict)
    """Per endpoint (instance id): when it began serving and its workers (pipeline stages):
    with `dispatched_s` and `endpoint`, a per-request timeline (benchmarks'
    `emulation/flexpipe_timeline.py` sets it beside the emulated runtime's)."""
