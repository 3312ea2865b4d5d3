"""One request as the serving runtime sees it, and what has happened to it.

What flows: the controller (or a benchmark) makes a `ServeRequest` from token ids and
`SamplingParams`; the `Server` (`runtime/server.py`) routes it to an endpoint
(`runtime/endpoints.py`), which appends tokens as they come back. `hops` records every
endpoint that served part of it, in order, so a reader (and a test) can see a request move
from an execution pipeline to a local instance at a mode switch. Owned by the runtime.
"""

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from surge.engine.sampling import SamplingParams, TokenLogprobs
from surge.runtime.clock import REAL_CLOCK, Clock


@dataclass
class ServeRequest:
    """One request and what has happened to it (mutable: tokens arrive over time)."""

    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_t: float = math.nan
    """When it arrived (`clock`; NaN when made: now)."""
    output_token_ids: list[int] = field(default_factory=list)
    first_token_t: float | None = None
    dispatched_t: float | None = None
    """When the router last handed it to an endpoint (`clock`)."""
    token_times: list[float] = field(default_factory=list)
    """When each token came back (`clock`)."""
    done_t: float | None = None
    finish_reason: str | None = None
    endpoint: str | None = None
    hops: list[str] = field(default_factory=list)
    """Every endpoint that served part of it, in order."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    on_done: Callable[[], None] | None = None
    """Called when the request finishes (the server dispatches queued work then)."""
    error: str | None = None
    """Why it failed (finish_reason "error"), e.g. an agent refused it."""
    logprobs: dict[int, TokenLogprobs] = field(default_factory=dict)
    """Output position -> its token's log-probabilities (only when the request asked;
    keyed by position so a token added without them, e.g. by a KV migration, leaves a
    gap instead of shifting the rest)."""
    cached_tokens: int | None = None
    """Prompt tokens its (last) prefill took from the prefix cache (None: not prefilled yet)."""
    refusals: int = 0
    """How many times an agent refused it (`LocalEndpoint.submit`)."""
    clock: Clock = field(default=REAL_CLOCK, repr=False, compare=False)
    """What its times are read from: its server's (`runtime/clock.py`; emulated seconds
    under GPU-time emulation)."""

    def __post_init__(self) -> None:
        if math.isnan(self.arrival_t):
            self.arrival_t = self.clock.now_s()

    def add_token(self, token: int, finished: bool, reason: str | None) -> None:
        now = self.clock.now_s()
        if self.first_token_t is None:
            self.first_token_t = now
        self.output_token_ids.append(token)
        self.token_times.append(now)
        if finished:
            self.done_t = now
            self.finish_reason = reason
            self.done.set()
            if self.on_done is not None:
                self.on_done()

    def add_logprobs(self, lp: TokenLogprobs) -> None:
        """The log-probabilities of the token `add_token` appends next."""
        self.logprobs[len(self.output_token_ids)] = lp

    def fail(self, message: str) -> None:
        """End it with finish_reason "error": it can never be served (the agent refused
        it), so whoever waits on `done` sees the reason instead of waiting forever."""
        if self.done.is_set():
            return
        self.error, self.finish_reason, self.done_t = message, "error", self.clock.now_s()
        self.done.set()
        if self.on_done is not None:
            self.on_done()

    @property
    def params_json(self) -> dict[str, Any]:
        """The sampling settings' wire form (one definition: `SamplingParams.to_json`)."""
        return self.params.to_json()
