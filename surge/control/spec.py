"""What a deployment is: a model, its autoscaling knobs, its SLOs and its scale-out strategy.

Plain data, validated on construction from JSON-like dicts (the HTTP API, the config file
and the SQLite store all go through `DeploymentSpec.from_json`). Every bad value raises a
`SurgeError` naming the field, which the API turns into a 400.
"""

import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from surge.errors import SurgeError

STRATEGIES = ("lambdascale", "blitzscale", "paraserve", "load-then-serve")
"""Scale-out strategies (see docs/control.md)."""
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _number(d: dict, key: str, default: float, minimum: float, inclusive: bool = True) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise SurgeError(f"{key} must be a number (got {v!r})")
    if v < minimum or (not inclusive and v == minimum):
        op = ">=" if inclusive else ">"
        raise SurgeError(f"{key} must be {op} {minimum} (got {v})")
    return float(v)


def _int(d: dict, key: str, default: int | None, minimum: int) -> int | None:
    v = d.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise SurgeError(f"{key} must be an integer (got {v!r})")
    if v < minimum:
        raise SurgeError(f"{key} must be >= {minimum} (got {v})")
    return v


def _unknown(d: dict, known: set[str], where: str) -> None:
    extra = sorted(set(d) - known)
    if extra:
        raise SurgeError(
            f"unknown field {extra[0]!r} in {where}; known: {', '.join(sorted(known))}"
        )


@dataclass(frozen=True)
class Autoscaling:
    """Knobs of one deployment's autoscaler (Knative-style, with a panic window)."""

    min_replicas: int = 0
    """Instances kept with no load; 0 = scale to zero."""
    max_replicas: int | None = None
    """Most instances; None = as many as the cluster has slots."""
    target_ongoing_requests: float = 4.0
    """Requests in flight (queued + running) one instance should carry."""
    upscale_delay_s: float = 0.0
    """Load must ask for more instances this long (the stable window) before a scale-out,
    unless the panic window fires or the model is at zero."""
    downscale_delay_s: float = 2.0
    """An idle instance above the last one is released after this long (BlitzScale: 2 s)."""
    keep_alive_s: float = 10.0
    """The last instance is released (scale to zero) after idling this long."""
    panic_window_s: float = 1.0
    """Load above `panic_threshold` x capacity for this long scales out at once."""
    panic_threshold: float = 2.0
    """Ratio of outstanding requests to (instances x target) that counts as a burst."""

    @staticmethod
    def from_json(d: Any) -> "Autoscaling":
        if d is None:
            return Autoscaling()
        if not isinstance(d, dict):
            raise SurgeError(f"autoscaling must be an object (got {d!r})")
        _unknown(d, {f.name for f in fields(Autoscaling)}, "autoscaling")
        base = Autoscaling()
        a = Autoscaling(
            min_replicas=_int(d, "min_replicas", base.min_replicas, 0) or 0,
            max_replicas=_int(d, "max_replicas", base.max_replicas, 1),
            target_ongoing_requests=_number(
                d, "target_ongoing_requests", base.target_ongoing_requests, 0, inclusive=False
            ),
            upscale_delay_s=_number(d, "upscale_delay_s", base.upscale_delay_s, 0),
            downscale_delay_s=_number(d, "downscale_delay_s", base.downscale_delay_s, 0),
            keep_alive_s=_number(d, "keep_alive_s", base.keep_alive_s, 0),
            panic_window_s=_number(d, "panic_window_s", base.panic_window_s, 0),
            panic_threshold=_number(d, "panic_threshold", base.panic_threshold, 1),
        )
        if a.max_replicas is not None and a.max_replicas < max(1, a.min_replicas):
            raise SurgeError(
                f"max_replicas ({a.max_replicas}) must be >= max(1, min_replicas "
                f"({a.min_replicas}))"
            )
        return a


@dataclass(frozen=True)
class Slo:
    """Latency objectives (reported against in /metrics; the autoscaler's target is the
    concurrency knob)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    @staticmethod
    def from_json(d: Any) -> "Slo":
        if d is None:
            return Slo()
        if not isinstance(d, dict):
            raise SurgeError(f"slo must be an object (got {d!r})")
        _unknown(d, {"ttft_ms", "tpot_ms"}, "slo")
        out = {}
        for k in ("ttft_ms", "tpot_ms"):
            if d.get(k) is not None:
                out[k] = _number(d, k, 0, 0, inclusive=False)
        return Slo(**out)


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: a served name bound to a model store."""

    name: str
    model: str
    """A store directory (`surge model import`) or a Hugging Face checkpoint directory."""
    strategy: str = "lambdascale"
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    slo: Slo = field(default_factory=Slo)

    @staticmethod
    def from_json(d: Any) -> "DeploymentSpec":
        if not isinstance(d, dict):
            raise SurgeError("a deployment must be a JSON object")
        _unknown(d, {"name", "model", "strategy", "autoscaling", "slo"}, "deployment")
        name, model = d.get("name"), d.get("model")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise SurgeError(
                f"name must be 1-64 characters of letters, digits, '.', '_' or '-' (got {name!r})"
            )
        if not isinstance(model, str) or not model:
            raise SurgeError("model must be a store or checkpoint directory path (a string)")
        strategy = d.get("strategy", "lambdascale")
        if strategy not in STRATEGIES:
            raise SurgeError(
                f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
            )
        return DeploymentSpec(
            name=name,
            model=model,
            strategy=strategy,
            autoscaling=Autoscaling.from_json(d.get("autoscaling")),
            slo=Slo.from_json(d.get("slo")),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
