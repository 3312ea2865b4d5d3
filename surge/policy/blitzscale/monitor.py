"""BlitzScale's load monitor bounds, profiled offline from a model's costs and its SLO (§5.3).

§5.3: the monitor "records the serving loads with tokens per second and KVCache usage
globally. When the average load surpasses a pre-defined upper bound, we allocate sufficient
instances to meet that demand. The upper bound can be derived by profiling the average
serving load per-instance offline." The paper gives no number; this derives one per model
and GPU from what each body knows offline of one instance's steps (`InstanceCosts`: the
simulator's cost model; `surge serve`'s emulated cost model, a profile of its real engine
(`StepProfile`, `profile_costs`) or, without one, its host estimates) and the
model's SLO (§3 sets them "based on inference speed": 450 ms TTFT and 150 ms TBT for
Llama2-7B):
- prefill bound: the prompt tokens/s one instance prefills at its largest prefill step
  (`max_prefill_tokens`); the load it is held against is the prompt tokens still waiting for
  their first token over the TTFT SLO (`policy.autoscale`: the prefill rate they need), so
  an instance is "full" when its queue is what it prefills within the SLO;
- decode bound: the tokens/s one instance generates at the largest batch (up to
  `max_batch`) whose step meets the TBT SLO;
- KV use: the system's own bound (`target_kv_usage`), not profiled.
A `StepProfile` is the steps one real engine took, measured once per model, device and
engine settings (`engine/step_profile.py`, cached by `runtime/step_profiles.py`); what
bound it gives is decided here (`profile_costs`): a step between two measured sizes is the
straight line between them, a prefill beyond the largest measured runs at that one's
per-token cost (longer prompts are prefilled in chunks of at most it), a decode batch
beyond the largest measured grows along the last measured segment.
Pure: `profiled` returns the settings with the bounds filled in; bounds a deployment set
itself stay. Both bodies call it (`sim/simulator.py`, `control/autoscaler.py`).
"""

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from surge.errors import SurgeError
from surge.policy.autoscale_settings import AutoscaleSettings
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


StepPoints = tuple[tuple[int, float], ...]
"""(size, seconds) pairs, sizes strictly increasing: prompt tokens or sequences per step."""


@dataclass(frozen=True)
class StepProfile:
    """One real engine's measured steps (BlitzScale §5.3: "profiling ... offline")."""

    prefill_s: StepPoints
    """(prompt tokens, seconds of one prefill step of one prompt that long)."""
    decode_s: StepPoints
    """(sequences, seconds of one decode step of that batch)."""

    def __post_init__(self) -> None:
        for name in ("prefill_s", "decode_s"):
            pts = getattr(self, name)
            if not pts:
                raise SurgeError(f"step profile: no {name} points")
            sizes = [n for n, _ in pts]
            if sizes[0] < 1 or any(b <= a for a, b in itertools.pairwise(sizes)):
                raise SurgeError(f"step profile: {name} sizes must be >= 1 and increasing")
            if any(not s > 0 for _, s in pts):  # also refuses NaN
                raise SurgeError(f"step profile: {name} seconds must be > 0")


def _interpolate(pts: StepPoints, size: int) -> float | None:
    """The straight line between the measured sizes around `size`: the first's seconds at
    or below it, None beyond the last."""
    if size <= pts[0][0]:
        return pts[0][1]
    for (a, sa), (b, sb) in itertools.pairwise(pts):
        if size <= b:
            return sa + (sb - sa) * (size - a) / (b - a)
    return None


def profile_costs(profile: StepProfile, max_prefill_tokens: int, max_batch: int) -> InstanceCosts:
    """One instance's costs from its engine's measured steps (module docstring)."""
    n_last, s_last = profile.prefill_s[-1]
    decode = profile.decode_s

    def prefill_s(tokens: int) -> float:
        if tokens <= profile.prefill_s[0][0]:  # a shorter prompt: its share of the shortest
            n0, s0 = profile.prefill_s[0]
            return s0 * tokens / n0
        s = _interpolate(profile.prefill_s, tokens)
        return s if s is not None else tokens * s_last / n_last

    def decode_s(batch: int) -> float:
        s = _interpolate(decode, batch)
        if s is not None:
            return s
        if len(decode) == 1:
            return decode[0][1]
        (a, sa), (b, sb) = decode[-2], decode[-1]
        return sb + max(0.0, (sb - sa) / (b - a)) * (batch - b)

    return InstanceCosts(prefill_s, decode_s, max_prefill_tokens, max_batch)


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
