"""Sampling: per-request settings (`SamplingParams`) and the `Sampler` that turns logits into
the next token of each sequence.

Greedy (temperature 0) is one argmax over the batch. Otherwise each sequence samples with its
own `torch.Generator`, so a seeded request gives the same tokens whatever it is batched with.

torch is imported where it is used, not at the top: `SamplingParams` is part of the agent
protocol, and processes that only move bytes (agents started without the engine, the
controller's client) must not pay ~1.5 s to import it. Logits may be a torch tensor (a local
runner's) or a numpy array (a pipeline's, from its last stage): a greedy batch that asks no
logprobs is an argmax of either and needs no torch (`needs_torch`), so a pipeline's head
engines serve it while the controller has not imported torch (`runtime/torch_import.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from surge.errors import SurgeError

if TYPE_CHECKING:
    import torch


SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_LOGPROBS = 20
"""Most alternatives per token (OpenAI's `top_logprobs` cap)."""
LOGPROB_FLOOR = -9999.0
"""What -inf becomes (JSON has no infinity), as vLLM does."""
"""Seeds are int64 (what every OpenAI-compatible server and torch's generator take)."""


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded."""

    max_tokens: int = 16
    """Most tokens to generate (generation also stops at the model's context length)."""
    temperature: float = 0.0
    """0 is greedy; higher is more random."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = no limit)."""
    seed: int | None = None
    """Seed of this request's random generator (None: fresh randomness)."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token."""
    stop_token_ids: tuple[int, ...] = field(default=())
    """Extra token ids that end generation."""
    logprobs: int | None = None
    """Return each chosen token's log-probability and this many most likely alternatives
    (None: none, and no cost)."""

    def validate(self) -> SamplingParams:
        if self.max_tokens < 1:
            raise SurgeError(f"max_tokens must be >= 1 (got {self.max_tokens})")
        if not 0 <= self.temperature < math.inf:  # NaN too: it is not "greedy"
            raise SurgeError(f"temperature must be a number >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise SurgeError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise SurgeError(f"top_k must be >= 0 (got {self.top_k})")
        check_seed(self.seed)
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise SurgeError(f"logprobs must be in 0..{MAX_LOGPROBS} (got {self.logprobs})")
        return self

    def to_json(self) -> dict[str, Any]:
        """The wire form (every field, `stop_token_ids` as a list)."""
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "ignore_eos": self.ignore_eos,
            "stop_token_ids": list(self.stop_token_ids),
            "logprobs": self.logprobs,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> SamplingParams:
        """Parse and validate the wire form; missing fields take the defaults above."""
        unknown = sorted(set(d) - _FIELDS)
        if unknown:
            raise SurgeError(f"unknown sampling field(s) {unknown}; known: {sorted(_FIELDS)}")
        kw = dict(d)
        for name, kinds in _KINDS.items():
            v = kw.get(name)
            if name in ("seed", "logprobs") and v is None:
                continue
            if name in kw and (isinstance(v, bool) or not isinstance(v, kinds)):
                raise SurgeError(f"sampling field {name!r} has a bad value {v!r}")
            if name in kw and kinds == _NUMBER:
                kw[name] = float(v)
        if not isinstance(kw.get("ignore_eos", False), bool):
            raise SurgeError("sampling field 'ignore_eos' must be true or false")
        stops = kw.get("stop_token_ids", ())
        if not isinstance(stops, list | tuple) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in stops
        ):
            raise SurgeError("sampling field 'stop_token_ids' must be a list of token ids")
        kw["stop_token_ids"] = tuple(stops)
        return SamplingParams(**kw).validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


_FIELDS = frozenset(f.name for f in fields(SamplingParams))
_NUMBER = (int, float)
_KINDS: dict[str, type | tuple[type, ...]] = {
    "max_tokens": int,
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "top_k": int,
    "seed": int,
    "logprobs": int,
}
"""JSON types of the numeric fields (bool is refused although it is an int)."""


def needs_torch(params: SamplingParams) -> bool:
    """Whether decoding a request takes torch: a sampled one (its `torch.Generator`) or one
    asking for logprobs. A greedy one without is an argmax (`Sampler`)."""
    return not params.greedy or params.logprobs is not None


def check_seed(seed: int | None) -> None:
    """A SurgeError for a seed outside int64 (torch would raise a bare overflow)."""
    if seed is not None and not SEED_MIN <= seed <= SEED_MAX:
        raise SurgeError(f"seed must be between {SEED_MIN} and {SEED_MAX} (got {seed})")


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator for one request: seeded, or from fresh OS randomness."""
    import torch

    check_seed(seed)

    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def _sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    import torch

    raw = logits.float().cpu()
    logits = raw / params.temperature
    if not bool(torch.isfinite(logits).all()):
        # A temperature near 0 (the API allows any value >= 0) overflows float32 logits / T
        # to inf and softmax to NaN: float64 then, and where that overflows too, T -> 0 is
        # greedy.
        logits = raw.double() / params.temperature
        if not bool(torch.isfinite(logits).all()):
            return int(raw.argmax())
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
        return int(raw.argmax())  # a degenerate distribution: its most likely token
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass(frozen=True)
class TokenLogprobs:
    """The log-probability of a chosen token and the `logprobs` most likely tokens, under
    the model's distribution (before temperature, top-k and top-p, as vLLM reports)."""

    logprob: float
    top: tuple[tuple[int, float], ...]
    """(token id, log-probability), most likely first."""


def token_logprobs(
    logits: torch.Tensor, params: list[SamplingParams], tokens: list[int]
) -> list[TokenLogprobs | None]:
    """Per row, its `TokenLogprobs` when its request asked (None otherwise). Only rows
    that asked are computed: a batch without logprobs pays nothing (and needs no torch)."""
    out: list[TokenLogprobs | None] = [None] * len(tokens)
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return out
    import torch

    lp = torch.log_softmax(torch.as_tensor(logits)[rows].float(), dim=-1).cpu()
    for j, i in enumerate(rows):
        k = params[i].logprobs or 0
        top: tuple[tuple[int, float], ...] = ()
        if k:
            vals, ids = torch.topk(lp[j], min(k, lp.shape[-1]))
            top = tuple(
                (int(t), max(float(v), LOGPROB_FLOOR))
                for t, v in zip(ids.tolist(), vals.tolist(), strict=True)
            )
        out[i] = TokenLogprobs(max(float(lp[j, tokens[i]]), LOGPROB_FLOOR), top)
    return out


class Sampler:
    """Picks the next token of every sequence in a batch."""

    def __call__(
        self,
        logits: Any,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> list[int]:
        """logits [B, vocab] (a torch tensor or a numpy array) -> one token id per row. The
        greedy rows are an argmax of either (both take the first of equal maxima)."""
        greedy = logits.argmax(-1).tolist()
        if all(p.greedy for p in params):
            return greedy
        import torch

        rows = torch.as_tensor(logits)
        return [
            greedy[i] if p.greedy else _sample_row(rows[i], p, generators[i])
            for i, p in enumerate(params)
        ]
