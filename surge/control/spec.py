"""What a deployment is: a model, its autoscaling knobs, its overload knobs (`admission`), its
SLOs, its scale-out strategy and, for `flexpipe`, its FlexPipe knobs (`flexpipe`).

Plain data, validated on construction from JSON-like dicts (the HTTP API, the config file
and the SQLite store all go through `DeploymentSpec.from_json`; a new one also through
`new_deployment`, which compiles its chat template). Every bad value raises a
`SurgeError` naming the field, which the API turns into a 400.
"""

import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from surge.errors import InvalidInput, SurgeError, shorten
from surge.policy.admission import AdmissionSettings
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.blitzscale.pd import PdTargets
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.slo import Slo
from surge.policy.systems import ALIASES, SystemConfig, serve_system

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A deployment name, matched whole (`fullmatch`: `$` let a trailing newline through)."""
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
    """A deployment's autoscaler knobs (`policy.autoscale_settings.AutoscaleSettings`, Ray Serve
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
        min_serving=_int(d, "min_serving", base.min_serving, 1) or 1,
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
        target_prefill_tokens_per_s=_optional(
            d, "target_prefill_tokens_per_s", base.target_prefill_tokens_per_s, 0
        ),
        prefill_within_s=_optional(d, "prefill_within_s", base.prefill_within_s, 0),
        count_in_flight=_flag(d, "count_in_flight", base.count_in_flight),
        profile_bounds=_flag(d, "profile_bounds", base.profile_bounds),
        always_ready_fraction=_number(d, "always_ready_fraction", base.always_ready_fraction, 0),
        forget_peak_after_idle_s=_optional(
            d, "forget_peak_after_idle_s", base.forget_peak_after_idle_s, 0
        ),
    )


def _flag(d: dict, key: str, default: bool) -> bool:
    """A JSON boolean; absent: `default`."""
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise SurgeError(f"{key} must be true or false (got {v!r})")
    return v


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


FLEXPIPE_KNOBS = (
    "stage_counts",
    "cv_targets",
    "cv_window_s",
    "decision_interval_s",
    "min_group_kv_tokens",
    "default_decode_steps",
)
"""The `FlexPipeSettings` fields a deployment may set (docs/flexpipe.md); the nested
constants (Eq. 4, 6, 11-13) stay the system's."""


def _numbers(d: dict, key: str, integer: bool, minimum: float) -> tuple:
    v = d[key]
    kind = "integers" if integer else "numbers"
    if not isinstance(v, list | tuple) or not v or any(x is None for x in v):
        raise SurgeError(f"{key} must be a non-empty list of {kind} (got {shorten(repr(v))})")
    return tuple(
        _int({key: x}, key, None, int(minimum)) if integer else _number({key: x}, key, 0, minimum)
        for x in v
    )


def flexpipe_from_json(d: Any, base: FlexPipeSettings) -> FlexPipeSettings:
    """A deployment's FlexPipe knobs (`FLEXPIPE_KNOBS`) over its system's `base` (a field
    left out keeps the base's value): e.g. `decision_interval_s` 0.05 lets the granularity
    loop split a group inside a burst of a few seconds (docs/emulation.md). Unknown fields
    and bad values raise `SurgeError` naming the field."""
    if not isinstance(d, dict):
        raise SurgeError(f"flexpipe must be an object (got {shorten(repr(d))})")
    _unknown(d, set(FLEXPIPE_KNOBS), "flexpipe")
    out: dict[str, Any] = {}
    for key in ("cv_window_s", "decision_interval_s"):
        if key in d:
            out[key] = _number(d, key, 0, 0, inclusive=False)
    for key in ("min_group_kv_tokens", "default_decode_steps"):
        if key in d:
            out[key] = _int(d, key, None, 1)
    if "stage_counts" in d:
        out["stage_counts"] = _numbers(d, "stage_counts", True, 1)
    if "cv_targets" in d:
        out["cv_targets"] = tuple(float(x) for x in _numbers(d, "cv_targets", False, 0))
    try:
        return replace(base, **out)
    except SurgeError as e:
        raise SurgeError(f"flexpipe: {e}") from None


def flexpipe_to_json(settings: FlexPipeSettings) -> dict[str, Any]:
    """The knobs `flexpipe_from_json` reads back (`FLEXPIPE_KNOBS`)."""
    out = {k: getattr(settings, k) for k in FLEXPIPE_KNOBS}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


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
    flexpipe: FlexPipeSettings | None = None
    """FlexPipe's knobs for this deployment (strategy `flexpipe` only; `flexpipe_from_json`
    over the system's); None: the system's (`policy/flexpipe/settings.py`)."""

    @property
    def system(self) -> SystemConfig:
        """The system this deployment runs: its strategy's, with its own FlexPipe knobs."""
        system = serve_system(self.strategy)
        return system if self.flexpipe is None else replace(system, flexpipe=self.flexpipe)

    @staticmethod
    def from_json(d: Any) -> "DeploymentSpec":
        if not isinstance(d, dict):
            raise SurgeError("a deployment must be a JSON object")
        known = {"name", "model", "strategy", "autoscaling", "slo", "admission", "pd"}
        known |= {"chat_template", "flexpipe"}
        _unknown(d, known, "deployment")
        name, model = d.get("name"), d.get("model")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
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
        system = serve_system(strategy)  # a clear error for unknown or simulator-only systems
        strategy = ALIASES.get(strategy, strategy)
        flexpipe = d.get("flexpipe")
        if flexpipe is not None and system.group_sizing != "flexpipe":
            raise SurgeError(
                f"flexpipe settings apply to strategy 'flexpipe' only (this deployment's is "
                f"{strategy!r}): remove them or set strategy: flexpipe"
            )
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
            flexpipe=None if flexpipe is None else flexpipe_from_json(flexpipe, system.flexpipe),
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["flexpipe"] = None if self.flexpipe is None else flexpipe_to_json(self.flexpipe)
        return out


def new_deployment(body: Any) -> DeploymentSpec:
    """A deployment asked for now (`POST /v1/deployments`, `surge serve`'s config file and
    `--model`): `from_json`'s checks, and its chat template compiles (a bad one used to
    fail only on the first chat request: 400 on every chat). Not in `from_json`: the store
    reads stored deployments back through it, and one stored before this check must still
    come back (its chats answer 400 naming the template, as before)."""
    spec = DeploymentSpec.from_json(body)
    if spec.chat_template is not None:
        from surge.model.chat_template import compile_chat_template

        try:
            compile_chat_template(spec.chat_template)
        except SurgeError as e:
            raise InvalidInput(f"chat_template {e}", param="chat_template") from None
    return spec
