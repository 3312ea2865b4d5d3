"""BlitzScale's load monitor bounds, profiled offline from a model's costs and its SLO (§5.3).

§5.3: the monitor "records the serving loads with tokens per second and KVCache usage
globally. When the average load surpasses a pre-defined upper bound, we allocate sufficient
instances to meet that demand. The upper bound can be derived by profiling the average
serving load per-instance offline." The paper gives no number; this derives one per model
and GPU from what each body knows offline of one instance's steps (`InstanceCosts`: the
simulator's cost model, `surge serve`'s emulated cost model or its host estimates) and the
model's SLO (§3 sets them "based on inference speed": 450 ms TTFT and 150 ms TBT for
Llama2-7B):
- prefill bound: the prompt tokens/s one instance prefills at its largest prefill step
  (`max_prefill_tokens`); the load it is held against is the prompt tokens still waiting for
  their first token over the TTFT SLO (`policy.autoscale`: the prefill rate they need), so
  an instance is "full" when its queue is what it prefills within the SLO;
- decode bound: the tokens/s one instance generates at the largest batch (up to
  `max_batch`) whose step meets the TBT SLO;
- KV use: the system's own bound (`target_kv_usage`), not profiled.
Pure: `profiled` returns the settings with the bounds filled in; bounds a deployment set
itself stay. Both bodies call it (`sim/simulator.py`, `control/autoscaler.py`).
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

from surge.errors import SurgeError
from surge.policy.autoscale import AutoscaleSettings
from surge.policy.slo import Slo


@dataclass(frozen=True)
class InstanceCosts:
    """One instance's step costs as profiled offline."""

    prefill_s: Callable[[int], float]
    """Seconds of one prefill step of that many prompt tokens."""
    decode_s: Callable[[int], float]
    """Seconds of one decode step of that many sequences."""
    max_prefill_tokens: int
    """Most prompt tokens one prefill step takes (the engine's limit)."""
    max_batch: int
    """Most sequences one decode step takes (the engine's limit)."""

    def __post_init__(self) -> None:
        if self.max_prefill_tokens < 1 or self.max_batch < 1:
            raise SurgeError("InstanceCosts: max_prefill_tokens and max_batch >= 1")


@dataclass(frozen=True)
class MonitorBounds:
    """One instance's upper bounds (BlitzScale §5.3)."""

    prefill_tokens_per_s: float
    """Prompt tokens/s it prefills at its largest prefill step."""
    decode_tokens_per_s: float
    """Tokens/s it generates at the largest batch whose step meets the TBT SLO."""
    decode_batch: int
    """That batch."""


def bounds(costs: InstanceCosts, slo: Slo) -> MonitorBounds:
    """One instance's bounds from its costs and the model's SLO (module docstring)."""
    n = costs.max_prefill_tokens
    prefill = n / costs.prefill_s(n)
    # decode steps grow with the batch: the largest within the TBT SLO, at least one
    batch = 1
    for b in range(costs.max_batch, 0, -1):
        if costs.decode_s(b) <= slo.tpot_s:
            batch = b
            break
    return MonitorBounds(prefill, batch / costs.decode_s(batch), batch)


def profiled(settings: AutoscaleSettings, costs: InstanceCosts, slo: Slo) -> AutoscaleSettings:
    """`settings` with the monitor's bounds it leaves None profiled (when it asks,
    `profile_bounds`); else `settings` as they are."""
    if not settings.profile_bounds:
        return settings
    b = bounds(costs, slo)
    fill = {
        "target_prefill_tokens_per_s": b.prefill_tokens_per_s,
        "prefill_within_s": slo.ttft_s,
        "target_tokens_per_s": b.decode_tokens_per_s,
    }
    return replace(settings, **{k: v for k, v in fill.items() if getattr(settings, k) is None})
