"""Sampling: per-request settings (`SamplingParams`), what picks one sequence's next token
(`Draw`, plain data that travels with a pipeline's step) and `sample`, which turns a step's
logits into the next token of each sequence (`Sampled`).

Where: wherever the logits are, in the process that ran the model's last layers — a local
instance's engine (`LocalExecutor`), or a pipeline's last stage (`runtime/node/serving.py`),
which sends back token ids, not logits. So the controller, where a pipeline's head engines
schedule, never samples and never imports torch.

Randomness: a sampled token's generator is seeded from the sequence's seed and the
position of the token it picks (`_token_seed`), not carried from step to step. A seeded
request therefore gives the same tokens whatever it is batched with and wherever each token
is picked: a local instance, any pipeline's last stage, after a mode switch, a refactoring,
a consolidation, a failover or a preemption (nothing to move, nothing to free). A request
without a seed gets one drawn once for its sequence (`SamplingParams.draw`).

torch is imported where it is used, not at the top: `SamplingParams` and `Draw` are part of
the agent protocol, and processes that only move bytes (the controller, its client) must not
pay ~1.5 s to import it.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from surge.engine.batch import BatchMeta
from surge.errors import SurgeError
from surge.json_codec import Message, require

if TYPE_CHECKING:
    import torch


SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
"""Seeds are int64 (what every OpenAI-compatible server and torch's generator take)."""
MAX_LOGPROBS = 20
"""Most alternatives per token (OpenAI's `top_logprobs` cap)."""
LOGPROB_FLOOR = -9999.0
"""What -inf becomes (JSON has no infinity), as vLLM does."""
_MASK64 = (1 << 64) - 1


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
    """Seed of this request's tokens (None: one drawn for its sequence, `draw`)."""
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
        _check_decoding(self.temperature, self.top_p, self.top_k, self.seed, self.logprobs)
        return self

    def draw(self) -> Draw:
        """What picks this request's tokens, for one sequence: a sampled one's seed is the
        request's, or, none named, drawn now from the OS, once (so the sequence keeps one
        stream of tokens wherever each is picked)."""
        seed = None
        if not self.greedy:
            seed = self.seed if self.seed is not None else secrets.randbits(63)
        return Draw(self.temperature, self.top_p, self.top_k, seed, self.logprobs)

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


def _check_decoding(
    temperature: float, top_p: float, top_k: int, seed: int | None, logprobs: int | None
) -> None:
    """A SurgeError naming the first setting sampling cannot honour."""
    if not 0 <= temperature < math.inf:  # NaN too: it is not "greedy"
        raise SurgeError(f"temperature must be a number >= 0 (got {temperature})")
    if not 0 < top_p <= 1:
        raise SurgeError(f"top_p must be in (0, 1] (got {top_p})")
    if top_k < 0:
        raise SurgeError(f"top_k must be >= 0 (got {top_k})")
    check_seed(seed)
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise SurgeError(f"logprobs must be in 0..{MAX_LOGPROBS} (got {logprobs})")


def check_seed(seed: int | None) -> None:
    """A SurgeError for a seed outside int64 (torch would raise a bare overflow)."""
    if seed is not None and not SEED_MIN <= seed <= SEED_MAX:
        raise SurgeError(f"seed must be between {SEED_MIN} and {SEED_MAX} (got {seed})")


@dataclass(frozen=True)
class Draw(Message):
    """What picks one sequence's next token: the sampling part of its `SamplingParams`,
    with a sampled sequence's seed always set. Plain data: it travels with each step of a
    pipeline to its last stage (`StageStepOp.draws`), which keeps nothing between steps."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    """Set when sampled (a token's generator is `_token_seed(seed, its position)`)."""
    logprobs: int | None = None

    def __post_init__(self) -> None:
        _check_decoding(self.temperature, self.top_p, self.top_k, self.seed, self.logprobs)
        require(self.greedy or self.seed is not None, "Draw", "a sampled row needs its seed")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_json(self) -> dict[str, Any]:
        """Only what differs from the defaults: a greedy row without logprobs is `{}`."""
        return {k: v for k, v in super().to_json().items() if v != _DRAW_DEFAULTS[k]}


_DRAW_DEFAULTS = {f.name: f.default for f in fields(Draw)}


@dataclass(frozen=True)
class TokenLogprobs(Message):
    """The log-probability of a chosen token and the `logprobs` most likely tokens, under
    the model's distribution (before temperature, top-k and top-p, as vLLM reports)."""

    logprob: float
    top: tuple[tuple[int, float], ...]
    """(token id, log-probability), most likely first."""


@dataclass(frozen=True)
class Sampled(Message):
    """The tokens a step picked: one per row that samples, in row order."""

    tokens: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprobs | None, ...] = ()
    """One per token when a row asked for them (None for the rows that did not); empty
    when none did."""

    def logprobs_of(self, i: int) -> TokenLogprobs | None:
        """The logprobs of token `i` (None: its row did not ask)."""
        return self.logprobs[i] if self.logprobs else None


def sample(logits: torch.Tensor, draws: Sequence[Draw | None], batch: BatchMeta) -> Sampled:
    """Logits [B, vocab] at each row's last new token -> the next token of every row with a
    draw (None: a prompt piece of a chunked prefill; `()`: no row samples), with the
    logprobs its row asks for. Greedy rows are one argmax; a sampled row draws from its own
    generator, seeded by its seed and the position of the token it picks (the tokens the
    sequence has after this step: `ctx_lens + q_lens`)."""
    rows = [b for b, d in enumerate(draws) if d is not None]
    if not rows:
        return Sampled()
    if len(draws) != logits.shape[0]:
        raise SurgeError(f"{len(draws)} draws for a step of {logits.shape[0]} rows")
    if len(rows) < len(draws):
        logits = logits[rows]
    picked = [d for d in draws if d is not None]
    greedy = logits.argmax(-1).tolist()
    if not all(d.greedy for d in picked):  # sampled rows: on the CPU, one copy for all
        logits = logits.float().cpu()
    tokens = [
        greedy[i] if d.greedy else _sample_row(logits[i], d, batch.ctx_lens[b] + batch.q_lens[b])
        for i, (b, d) in enumerate(zip(rows, picked, strict=True))
    ]
    return Sampled(tuple(tokens), token_logprobs(logits, picked, tokens))


def _token_seed(seed: int, position: int) -> int:
    """The seed of the generator that picks the token at `position` (its index in prompt +
    output) of a sequence seeded `seed`: output number `position + 1` of splitmix64 started
    at `seed` (Steele, Lea & Flood, OOPSLA '14; Vigna's finalizer), computed directly, so
    neighbouring positions and seeds get unrelated streams. In [0, 2**64), which
    `torch.Generator.manual_seed` takes."""
    x = (seed + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _sample_row(logits: torch.Tensor, draw: Draw, position: int) -> int:
    import torch

    raw = logits.float().cpu()
    logits = raw / draw.temperature
    if not bool(torch.isfinite(logits).all()):
        # A temperature near 0 (the API allows any value >= 0) overflows float32 logits / T
        # to inf and softmax to NaN: float64 then, and where that overflows too, T -> 0 is
        # greedy.
        logits = raw.double() / draw.temperature
        if not bool(torch.isfinite(logits).all()):
            return int(raw.argmax())
    if draw.top_k and draw.top_k < logits.shape[-1]:
        kth = torch.topk(logits, draw.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if draw.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= draw.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
        return int(raw.argmax())  # a degenerate distribution: its most likely token
    assert draw.seed is not None  # a sampled Draw has one
    generator = torch.Generator().manual_seed(_token_seed(draw.seed, position))
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprobs(
    logits: torch.Tensor, draws: list[Draw], tokens: list[int]
) -> tuple[TokenLogprobs | None, ...]:
    """Per row, its `TokenLogprobs` when its draw asks (None otherwise); `()` when no row
    asks (a batch without logprobs pays nothing)."""
    rows = [i for i, d in enumerate(draws) if d.logprobs is not None]
    if not rows:
        return ()
    import torch

    out: list[TokenLogprobs | None] = [None] * len(tokens)
    lp = torch.log_softmax(logits[rows].float(), dim=-1).cpu()
    for j, i in enumerate(rows):
        k = draws[i].logprobs or 0
        top: tuple[tuple[int, float], ...] = ()
        if k:
            vals, ids = torch.topk(lp[j], min(k, lp.shape[-1]))
            top = tuple(
                (int(t), max(float(v), LOGPROB_FLOOR))
                for t, v in zip(ids.tolist(), vals.tolist(), strict=True)
            )
        out[i] = TokenLogprobs(max(float(lp[j, tokens[i]]), LOGPROB_FLOOR), top)
    return tuple(out)
