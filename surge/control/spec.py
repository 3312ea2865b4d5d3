"""What a deployment is: a model, its autoscaling knobs, its overload knobs (`admission`), its
SLOs and its scale-out strategy.

Plain data, validated on construction from JSON-like dicts (the HTTP API, the config file
and the SQLite store all go through `DeploymentSpec.from_json`). Every bad value raises a
`SurgeError` naming the field, which the API turns into a 400.
"""

import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from surge.errors import SurgeError, shorten
from surge.policy.admission import AdmissionSettings
from surge.policy.autoscale import AutoscaleSettings
from surge.policy.blitzscale.pd import PdTargets
from surge.policy.slo import Slo
from surge.policy.systems import ALIASES, serve_system

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_PATH_CHARS = 4096
"""Longest model path accepted (Linux's PATH_MAX): a longer one cannot name a directory."""


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


def _optional(d: dict, key: str, default: float | None, minimum: float) -> float | None:
    """A number > `minimum` or null; absent: `default`."""
    v = d.get(key, default)
    return None if v is None else _number({key: v}, key, 0, minimum, inclusive=False)


def autoscaling_from_json(d: Any, base: AutoscaleSettings | None = None) -> AutoscaleSettings:
    """A deployment's autoscaler knobs (`surge.policy.autoscale.AutoscaleSettings`, Ray Serve
    names) from JSON over `base` (its system's `autoscale`, default `AutoscaleSettings()`: a
    field left out keeps the base's value); unknown fields and bad values raise
    `SurgeError` naming the field."""
    base = base or AutoscaleSettings()
    if d is None:
        return base
    if not isinstance(d, dict):
        raise SurgeError(f"autoscaling must be an object (got {d!r})")
    _unknown(d, {f.name for f in fields(AutoscaleSettings)}, "autoscaling")
    keep = d.get("keep_alive_s", base.keep_alive_s)
    return AutoscaleSettings(
        min_replicas=_int(d, "min_replicas", base.min_replicas, 0) or 0,
        max_replicas=_int(d, "max_replicas", base.max_replicas, 1),
        target_ongoing_requests=_number(
            d, "target_ongoing_requests", base.target_ongoing_requests, 0, inclusive=False
        ),
        upscale_delay_s=_number(d, "upscale_delay_s", base.upscale_delay_s, 0),
        downscale_delay_s=_number(d, "downscale_delay_s", base.downscale_delay_s, 0),
        keep_alive_s=None
        if keep is None
        else _number({"keep_alive_s": keep}, "keep_alive_s", 0, 0),
        panic_window_s=_number(d, "panic_window_s", base.panic_window_s, 0),
        panic_threshold=_number(d, "panic_threshold", base.panic_threshold, 1),
        max_scale_out_per_decision=_int(
            d, "max_scale_out_per_decision", base.max_scale_out_per_decision, 1
        ),
        target_tokens_per_s=_optional(d, "target_tokens_per_s", base.target_tokens_per_s, 0),
        target_kv_usage=_optional(d, "target_kv_usage", base.target_kv_usage, 0),
    )


def admission_from_json(d: Any) -> AdmissionSettings:
    """A deployment's overload knobs (`surge.policy.admission.AdmissionSettings`: the hold
    queue's bound and timeout) from JSON; bad values raise `SurgeError` naming the field."""
    if d is None:
        return AdmissionSettings()
    if not isinstance(d, dict):
        raise SurgeError(f"admission must be an object (got {d!r})")
    _unknown(d, {f.name for f in fields(AdmissionSettings)}, "admission")
    base = AdmissionSettings()
    return AdmissionSettings(
        max_queued_requests=_int(d, "max_queued_requests", base.max_queued_requests, 1)
        or base.max_queued_requests,
        hold_timeout_s=_number(d, "hold_timeout_s", base.hold_timeout_s, 0, inclusive=False),
    )


def pd_from_json(d: Any) -> PdTargets | None:
    """A deployment's P/D split (`pd: {prefill: n, decode: m}`, BlitzScale §6); None = the
    system decides (disaggregated with 1:1 targets when it runs P/D, else not)."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise SurgeError(f"pd must be an object like {{'prefill': 1, 'decode': 1}} (got {d!r})")
    _unknown(d, {"prefill", "decode"}, "pd")
    return PdTargets(prefill=_int(d, "prefill", 1, 1) or 1, decode=_int(d, "decode", 1, 1) or 1)


@dataclass(frozen=True)
class SloSpec:
    """A deployment's latency objectives as its JSON gives them, in milliseconds (reported
    against in /metrics; the autoscaler's target is the concurrency knob). Unset: the
    policy's default (`seconds`)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    @staticmethod
    def from_json(d: Any) -> "SloSpec":
        if d is None:
            return SloSpec()
        if not isinstance(d, dict):
            raise SurgeError(f"slo must be an object (got {d!r})")
        _unknown(d, {"ttft_ms", "tpot_ms"}, "slo")
        out = {}
        for k in ("ttft_ms", "tpot_ms"):
            if d.get(k) is not None:
                out[k] = _number(d, k, 0, 0, inclusive=False)
        return SloSpec(**out)

    def seconds(self) -> Slo:
        """The objectives in seconds, unset ones at `policy.slo.Slo`'s defaults."""
        dflt = Slo()
        return Slo(
            ttft_s=self.ttft_ms / 1e3 if self.ttft_ms else dflt.ttft_s,
            tpot_s=self.tpot_ms / 1e3 if self.tpot_ms else dflt.tpot_s,
        )


def _chat_template(t: Any) -> str | None:
    if t is not None and (not isinstance(t, str) or not t.strip()):
        raise SurgeError("chat_template must be a Jinja template's text (a non-empty string)")
    return t


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: a served name bound to a model store."""

    name: str
    model: str
    """A store directory (`surge model import`) or a Hugging Face checkpoint directory."""
    strategy: str = "lambdascale"
    """A `surge.policy.systems` entry that `surge serve` carries out."""
    autoscaling: AutoscaleSettings = field(default_factory=AutoscaleSettings)
    """The autoscaler's knobs: the strategy's system's (`SystemConfig.autoscale`), with the
    fields the deployment gives overriding them."""
    slo: SloSpec = field(default_factory=SloSpec)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    """The hold queue: its bound (429 past it) and its timeout (503 past it)."""
    pd: PdTargets | None = None
    """Prefill/decode disaggregation targets; None = as the strategy's system says."""
    chat_template: str | None = None
    """A Jinja chat template (its text) used instead of the model's own (`surge serve
    --chat-template FILE`); None: the model's (`surge.api.chat`)."""

    @staticmethod
    def from_json(d: Any) -> "DeploymentSpec":
        if not isinstance(d, dict):
            raise SurgeError("a deployment must be a JSON object")
        known = {"name", "model", "strategy", "autoscaling", "slo", "admission", "pd"}
        known.add("chat_template")
        _unknown(d, known, "deployment")
        name, model = d.get("name"), d.get("model")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise SurgeError(
                "name must be 1-64 characters of letters, digits, '.', '_' or '-' (got "
                f"{shorten(name) if isinstance(name, str) else name!r})"
            )
        if not isinstance(model, str) or not model:
            raise SurgeError("model must be a store or checkpoint directory path (a string)")
        if len(model) > MAX_PATH_CHARS:
            raise SurgeError(
                f"model is a path of {len(model)} characters; paths are at most "
                f"{MAX_PATH_CHARS} (give the store or checkpoint directory)"
            )
        strategy = d.get("strategy", "lambdascale")
        if not isinstance(strategy, str):
            raise SurgeError(f"strategy must be a string (got {strategy!r})")
        serve_system(strategy)  # a clear error for unknown or simulator-only systems
        strategy = ALIASES.get(strategy, strategy)
        return DeploymentSpec(
            name=name,
            model=model,
            strategy=strategy,
            autoscaling=autoscaling_from_json(
                d.get("autoscaling"), serve_system(strategy).autoscale
            ),
            slo=SloSpec.from_json(d.get("slo")),
            admission=admission_from_json(d.get("admission")),
            pd=pd_from_json(d.get("pd")),
            chat_template=_chat_template(d.get("chat_template")),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
