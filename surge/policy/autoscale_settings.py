"""A pool's autoscaler knobs: `AutoscaleSettings` (Ray Serve names), validated once.

In: a system's defaults (`policy.systems.SystemConfig.autoscale`), overridden field by field
by a deployment's `autoscaling` (`control.spec`), the load monitor's bounds filled in by
`policy.blitzscale.monitor.profiled`, and capped to the cluster (`capped`). Out: the settings
`policy.autoscale.decide` reads on every tick of `surge serve`'s controller and the
simulator. The rules those knobs drive, and the papers they cite, are in `policy.autoscale`'s
docstring; this module owns only the knobs, their defaults and their validation.
"""

from dataclasses import dataclass, replace

from surge.errors import SurgeError

FORGET_PEAK_AFTER_IDLE_S = 900.0
"""Default `AutoscaleSettings.forget_peak_after_idle_s`: 15 minutes with no request at all,
three of FlexPipe's 5-minute reclamation windows (§9.4). FlexPipe keeps "30% of
historical peak capacity" always on (§9.6) for pools that serve production traffic
without pause (§9.1's runs: 20 QPS for 2 hours); it says nothing of a pool whose traffic
stops. Three windows outlast a lull between bursts (the groups above the floor have gone
by then) yet give an abandoned deployment's GPUs back within a quarter of an hour instead
of never: the point of serverless serving."""


@dataclass(frozen=True)
class AutoscaleSettings:
    """Knobs of one pool's autoscaler (Ray Serve names). Validated at construction."""

    target_ongoing_requests: float = 4.0
    """Requests in flight (queued + running) one instance should carry; > 0."""
    min_replicas: int = 0
    """Instances kept with no load; 0 = scale to zero."""
    max_replicas: int | None = None
    """Most instances of the pool; None = as many as fit."""
    min_serving: int = 1
    """Instances the pool holds at least while any request is outstanding (within
    `max_replicas`); >= 1. A P/D deployment's is 2 (`policy.blitzscale.pd.serving_floor`)."""
    upscale_delay_s: float = 0.0
    """Load must ask for more instances this long before a scale-out (the stable window),
    unless the pool is at zero or in panic; >= 0."""
    downscale_delay_s: float = 2.0
    """An idle instance above the last one is released after this long; >= 0."""
    keep_alive_s: float | None = 10.0
    """The last instance is released (scale to zero) after idling this long; None = the
    same as `downscale_delay_s`."""
    panic_window_s: float = 1.0
    """How long panic lasts once load crosses `panic_threshold`; >= 0 (0 = no panic)."""
    panic_threshold: float = 2.0
    """Outstanding / (instances x target) at which panic starts; >= 1."""
    max_scale_out_per_decision: int | None = None
    """Most instances added by one decision; None = no limit."""
    target_tokens_per_s: float | None = None
    """Tokens/s one instance should generate at most (the load monitor's per-instance upper
    bound, BlitzScale §5.3, profiled offline); > 0, None = tokens/s does not count."""
    target_kv_usage: float | None = None
    """KV-cache fraction one instance should fill at most (0, 1]; None = KV use does not
    count."""
    target_prefill_tokens_per_s: float | None = None
    """Prompt tokens/s one instance prefills (the monitor's prefill bound, BlitzScale §5.3);
    > 0, None = prefill tokens do not count."""
    prefill_within_s: float | None = None
    """Waiting prompt tokens are prefill load per this many seconds (the TTFT SLO); > 0,
    None = prefill tokens do not count."""
    count_in_flight: bool = True
    """Requests in flight size the pool (`target_ongoing_requests`, Knative's panic);
    False: only the load monitor's terms do (BlitzScale §5.3)."""
    profile_bounds: bool = False
    """The monitor's bounds left None are profiled per model offline by each body before
    deciding (`policy.blitzscale.monitor.profiled`, BlitzScale §5.3: "The upper bound can
    be derived by profiling the average serving load per-instance offline")."""
    always_ready_fraction: float = 0.0
    """Fraction of the pool's historical peak (the most instances it has held) kept ready
    however idle it is, rounded up; in [0, 1], 0 = none (FlexPipe §9.1: 0.3)."""
    forget_peak_after_idle_s: float | None = FORGET_PEAK_AFTER_IDLE_S
    """The historical peak (and with it the always-ready floor) is forgotten once the pool
    has had no request in flight for this long, so an idle pool returns to zero; > 0, None
    = never (the floor stays for the pool's life). Only matters with
    `always_ready_fraction` > 0."""

    def __post_init__(self) -> None:
        if not self.target_ongoing_requests > 0:
            raise SurgeError(
                f"target_ongoing_requests must be > 0 (got {self.target_ongoing_requests})"
            )
        for name in ("upscale_delay_s", "downscale_delay_s", "panic_window_s"):
            if not getattr(self, name) >= 0:
                raise SurgeError(f"{name} must be >= 0 (got {getattr(self, name)})")
        if self.keep_alive_s is not None and not self.keep_alive_s >= 0:
            raise SurgeError(f"keep_alive_s must be >= 0 or null (got {self.keep_alive_s})")
        if not self.panic_threshold >= 1:
            raise SurgeError(f"panic_threshold must be >= 1 (got {self.panic_threshold})")
        if self.min_replicas < 0:
            raise SurgeError(f"min_replicas must be >= 0 (got {self.min_replicas})")
        if self.min_serving < 1:
            raise SurgeError(f"min_serving must be >= 1 (got {self.min_serving})")
        if self.max_replicas is not None and self.max_replicas < max(1, self.min_replicas):
            raise SurgeError(
                f"max_replicas ({self.max_replicas}) must be >= max(1, min_replicas "
                f"({self.min_replicas}))"
            )
        if self.max_scale_out_per_decision is not None and self.max_scale_out_per_decision < 1:
            raise SurgeError("max_scale_out_per_decision must be >= 1 or null")
        if self.target_tokens_per_s is not None and not self.target_tokens_per_s > 0:
            raise SurgeError(
                f"target_tokens_per_s must be > 0 or null (got {self.target_tokens_per_s})"
            )
        if self.forget_peak_after_idle_s is not None and not self.forget_peak_after_idle_s > 0:
            raise SurgeError(
                "forget_peak_after_idle_s must be > 0 or null "
                f"(got {self.forget_peak_after_idle_s})"
            )
        if not 0 <= self.always_ready_fraction <= 1:
            raise SurgeError(
                f"always_ready_fraction must be in [0, 1] (got {self.always_ready_fraction})"
            )
        if self.target_kv_usage is not None and not 0 < self.target_kv_usage <= 1:
            raise SurgeError(
                f"target_kv_usage must be in (0, 1] or null (got {self.target_kv_usage})"
            )
        for name in ("target_prefill_tokens_per_s", "prefill_within_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise SurgeError(f"{name} must be > 0 or null (got {value})")

    @property
    def last_keep_alive_s(self) -> float:
        """How long the last instance idles before release."""
        return self.downscale_delay_s if self.keep_alive_s is None else self.keep_alive_s

    def capped(self, max_slots: int) -> "AutoscaleSettings":
        """These settings within a cluster of `max_slots` instance slots (>= 1 kept)."""
        cap = max(1, max_slots if self.max_replicas is None else min(self.max_replicas, max_slots))
        return replace(self, max_replicas=cap, min_replicas=min(self.min_replicas, cap))
