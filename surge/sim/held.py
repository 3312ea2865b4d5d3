"""The requests one endpoint holds, counted as its head engines take and let them go.

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
each). tests/sim/test_sim_speed.py checks both against the collections at every read.
"""

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
