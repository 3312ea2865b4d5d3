"""The requests one endpoint holds, counted as its head engines take and let them go, and
the prompt tokens waiting in a pool's router queue, counted as it changes.

In: each change to a head's waiting queue, prefill step or decode batch, made where the
change is made (`sim/batching.py`, `sim/decode_clock.py`, `sim/serving_engine.py`,
`sim/serving_merge.py`). Out: `n`, always the sum over the endpoint's heads of waiting +
prefilling + decoding requests, and `prompt_tokens`, always the prompt tokens of its waiting
and prefilling requests without a first token (the load monitor's prefill load), at every
instant a callback can read them: a batch taken out before its callbacks run is counted out
before them, as the collections are. Owned by sim/.

Why: the router reads every endpoint's count at each decision and the autoscaler both at
each look (`sim/pools.py`, `sim/scaling.py`); summing a pipeline's heads' queues each time
was most of a FlexPipe run's cost (§9 setting, llama2-7b, CV 8: 582,000 reads of four heads
each). `RouterQueue`: a pool's router queue keeps the prompt tokens of its requests without
a first token the same way; each autoscaler look summed the whole queue (λScale Fig. 11's
stress burst, 13B: 10 million requests read by 6,000 looks). tests/sim/test_sim_speed.py
checks all three against the collections at every read.
"""

from collections import deque
from collections.abc import Iterable

from surge.sim.request import SimRequest


class HeldCount:
    """One endpoint's held requests (shared by its heads and their clocks)."""

    __slots__ = ("n", "prompt_tokens")

    def __init__(self) -> None:
        self.n = 0
        """Requests waiting, prefilling or decoding on the endpoint's heads."""
        self.prompt_tokens = 0
        """Prompt tokens of its waiting and prefilling requests without a first token."""


def without_first_token(reqs: Iterable[SimRequest]) -> int:
    """Prompt tokens of those of `reqs` without a first token yet."""
    return sum(r.input_tokens for r in reqs if r.first_token_s < 0)


class RouterQueue(deque[SimRequest]):
    """A pool's router queue (oldest first) and the prompt tokens of its requests without a
    first token (the load monitor's share of the router, `sim/scaling.py` `pool_load`). Every
    way to add or remove a request keeps the count; a request's first token is never set
    while it waits here (only a prefill on an endpoint sets it)."""

    def __init__(self, reqs: Iterable[SimRequest] = ()) -> None:
        super().__init__()
        self._prompt_tokens = 0
        self.extend(reqs)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of its requests without a first token."""
        return self._prompt_tokens

    def append(self, req: SimRequest) -> None:
        super().append(req)
        if req.first_token_s < 0:
            self._prompt_tokens += req.input_tokens

    def appendleft(self, req: SimRequest) -> None:
        super().appendleft(req)
        if req.first_token_s < 0:
            self._prompt_tokens += req.input_tokens

    def popleft(self) -> SimRequest:
        req = super().popleft()
        if req.first_token_s < 0:
            self._prompt_tokens -= req.input_tokens
        return req

    def pop(self) -> SimRequest:
        req = super().pop()
        if req.first_token_s < 0:
            self._prompt_tokens -= req.input_tokens
        return req

    def extend(self, reqs: Iterable[SimRequest]) -> None:
        for req in reqs:
            self.append(req)

    def extendleft(self, reqs: Iterable[SimRequest]) -> None:
        for req in reqs:
            self.appendleft(req)

    def remove(self, req: SimRequest) -> None:
        super().remove(req)
        if req.first_token_s < 0:
            self._prompt_tokens -= req.input_tokens

    def clear(self) -> None:
        super().clear()
        self._prompt_tokens = 0

    def insert(self, index: int, req: SimRequest) -> None:
        raise NotImplementedError("a router queue takes requests at its ends")

    def __setitem__(self, index, value) -> None:
        raise NotImplementedError("a router queue takes requests at its ends")

    def __delitem__(self, index) -> None:
        raise NotImplementedError("a router queue takes requests at its ends")

    def __iadd__(self, reqs):
        self.extend(reqs)
        return self

    def __imul__(self, count):
        raise NotImplementedError("a router queue takes requests at its ends")
