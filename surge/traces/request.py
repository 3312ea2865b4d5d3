"""The `Trace`: a column store of requests, sorted by arrival.

In: arrays from a loader or generator. Out: a validated, immutable-by-convention
`Trace` that the simulator replays. Columns are numpy arrays so that slicing and
rate scaling of 20k-request traces cost microseconds.
"""

from dataclasses import dataclass, field

import numpy as np

from surge.errors import SurgeError


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order. Validated at construction."""

    name: str
    """Where it came from (file stem or generator description)."""
    arrival_s: np.ndarray
    """Arrival time of each request, seconds from the start of the trace, non-decreasing."""
    input_tokens: np.ndarray
    """Prompt length of each request (int64, >= 1)."""
    output_tokens: np.ndarray
    """Generated tokens of each request (int64, >= 1)."""
    model_index: np.ndarray = field(default=None)  # type: ignore[assignment]
    """Index into `model_names` of each request's model (int64); all zeros if one model."""
    model_names: tuple[str, ...] = ()
    """Model names the trace itself carries (e.g. BurstGPT's `Model` column); may be empty."""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if self.model_index is None:
            object.__setattr__(self, "model_index", np.zeros(n, dtype=np.int64))
        for name in ("input_tokens", "output_tokens", "model_index"):
            if len(getattr(self, name)) != n:
                raise SurgeError(f"trace {self.name}: column {name} has the wrong length")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise SurgeError(f"trace {self.name}: arrivals must be sorted by time")
        if n and (self.arrival_s[0] < 0 or not np.all(np.isfinite(self.arrival_s))):
            raise SurgeError(f"trace {self.name}: arrival times must be finite and >= 0")

    @property
    def num_requests(self) -> int:
        """How many requests the trace holds."""
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """Time of the last arrival (0 for an empty trace)."""
        return float(self.arrival_s[-1]) if self.num_requests else 0.0

    def take(self, mask_or_index: np.ndarray, name: str | None = None) -> "Trace":
        """The requests selected by a boolean mask or index array, same model names."""
        return Trace(
            name or self.name,
            self.arrival_s[mask_or_index],
            self.input_tokens[mask_or_index],
            self.output_tokens[mask_or_index],
            self.model_index[mask_or_index],
            self.model_names,
        )


def make_trace(
    name: str,
    arrival_s: np.ndarray | list[float],
    input_tokens: np.ndarray | list[int],
    output_tokens: np.ndarray | list[int],
    model_index: np.ndarray | list[int] | None = None,
    model_names: tuple[str, ...] = (),
) -> Trace:
    """Build a trace from columns, sorting by arrival (stable) and clamping tokens to >= 1."""
    arrival = np.asarray(arrival_s, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    ins = np.maximum(np.asarray(input_tokens, dtype=np.int64), 1)
    outs = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
    models = (
        np.zeros(len(arrival), dtype=np.int64)
        if model_index is None
        else np.asarray(model_index, dtype=np.int64)
    )
    if len(arrival):
        arrival = arrival - 0.0
    return Trace(name, arrival[order], ins[order], outs[order], models[order], model_names)
