"""Latency objectives (SLOs) of one model, in seconds: the one type and the one set of defaults.

In: a deployment's `slo` (its JSON is in milliseconds, `control/spec.py` `SloSpec`, which
fills what it leaves unset from here), or `surge simulate --slo-ttft-s/--slo-tpot-s`, or a
scenario file. Out: the objectives every decision that weighs latency reads (ParaServe's
group sizing §4.1, BlitzScale's live-scaling check §4, the simulator's SLO attainment).
"""

from dataclasses import dataclass

from surge.errors import SurgeError


@dataclass(frozen=True)
class Slo:
    """Latency objectives of one model."""

    ttft_s: float = 5.0
    """Time to first token a request must meet (ParaServe §8 evaluates seconds-scale TTFT
    SLOs for cold starts)."""
    tpot_s: float = 0.2
    """Time per output token after the first (a readable 5 tokens/s)."""

    def __post_init__(self) -> None:
        if not self.ttft_s > 0 or not self.tpot_s > 0:
            raise SurgeError("SLOs must be > 0 s")


BLITZSCALE_SLOS: dict[str, Slo] = {
    "llama2-7b": Slo(ttft_s=0.45, tpot_s=0.15),
    "llama2-70b": Slo(ttft_s=1.25, tpot_s=0.2),
}
"""The SLOs BlitzScale sets per model (§3: "We set TTFT and TBT SLO based on inference speed
of different models. Specifically, 450ms and 150ms for Llama2-7B model, and 1250ms and
200ms for Llama2-70B model with tensor parallelism degree of 4"; TBT is surge's `tpot_s`).
The paper gives no other model's."""
