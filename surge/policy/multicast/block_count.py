"""Choosing B, the number of blocks, at the elbow of completion time vs B.

In: `BlockCountSettings` (model size, N, K, strategy, links, per-transfer overhead,
the largest B allowed).
Out: `BlockCountChoice`: the completion time of every candidate B under the timing
model, and the B at the curve's elbow.

λScale §4.2 "selective block sizes" (Fig. 18): more, smaller blocks shorten the
pipeline fill (T ~ M (1 + log N / b)), but every transfer pays a fixed overhead and
every block boundary costs activations between pipeline stages, so past an elbow the
gain is not worth it. We take the elbow to be the fewest blocks whose completion time
is within `tolerance` of the fastest candidate: past it, more blocks buy less than
that. (A geometric knee of T ~ 1 + c/B sits at very few blocks, tens of percent off
the best time, so it is not used.)
"""

from collections.abc import Sequence
from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.scale_out import MulticastRequest, plan_multicast
from surge.policy.multicast.timing import TimingModel, simulate


@dataclass(frozen=True)
class BlockCountSettings:
    """What to choose B for. Validated at construction."""

    model_bytes: int
    """Size of the whole model in bytes (> 0)."""
    num_nodes: int
    """N, nodes in the scale-out (>= 2)."""
    num_sources: int = 1
    """K, nodes already holding the model."""
    max_blocks: int = 64
    """Largest B to consider, e.g. the number of layers (a block holds >= 1 layer)."""
    strategy: str = "binomial"
    """Multicast strategy whose completion time is measured."""
    cluster: Cluster | None = None
    """Links; None means uniform default links."""
    transfer_overhead_s: float = 0.0
    """Fixed cost per transfer in seconds; it is what makes many blocks costly."""
    tolerance: float = 0.05
    """How much slower than the fastest candidate the chosen B may be (0.05 = 5%)."""

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance < 1:
            raise SurgeError(f"tolerance must be in [0, 1) (got {self.tolerance})")
        if self.model_bytes <= 0:
            raise SurgeError(f"model size must be > 0 bytes (got {self.model_bytes})")
        if self.max_blocks < 1:
            raise SurgeError(f"max_blocks must be >= 1 (got {self.max_blocks})")
        # Validates N, K, strategy and cluster the same way a plan request does.
        self.request(1)

    def request(self, num_blocks: int) -> MulticastRequest:
        """The multicast request for B = num_blocks (block size rounded up)."""
        return MulticastRequest(
            num_nodes=self.num_nodes,
            num_blocks=num_blocks,
            num_sources=self.num_sources,
            strategy=self.strategy,
            cluster=self.cluster,
            block_bytes=-(-self.model_bytes // num_blocks),
            transfer_overhead_s=self.transfer_overhead_s,
        )


@dataclass(frozen=True)
class BlockCountChoice:
    """The chosen B and the curve it was chosen from."""

    num_blocks: int
    """B at the elbow."""
    curve: tuple[tuple[int, float], ...]
    """(B, completion seconds) for every candidate, B ascending."""


def completion_s(settings: BlockCountSettings, num_blocks: int) -> float:
    """Completion time of the multicast with B = num_blocks."""
    request = settings.request(num_blocks)
    plan = plan_multicast(request)
    model = TimingModel.uniform_blocks(
        request.links, num_blocks, request.block_bytes, request.transfer_overhead_s
    )
    return simulate(plan, (), model).complete_s


def elbow_index(values_s: Sequence[float], tolerance: float) -> int:
    """Index of the first value within `tolerance` of the smallest one."""
    if not values_s:
        raise SurgeError("elbow needs at least one candidate")
    limit = min(values_s) * (1 + tolerance)
    return next(i for i, v in enumerate(values_s) if v <= limit)


def choose_block_count(
    settings: BlockCountSettings, candidates: Sequence[int] | None = None
) -> BlockCountChoice:
    """Evaluate every candidate B (default 1..max_blocks) and pick the elbow."""
    xs = sorted(set(candidates or range(1, settings.max_blocks + 1)))
    if xs[0] < 1 or xs[-1] > settings.max_blocks:
        raise SurgeError(f"candidate block counts must lie in 1..{settings.max_blocks}")
    values = [completion_s(settings, b) for b in xs]
    chosen = xs[elbow_index(values, settings.tolerance)]
    return BlockCountChoice(chosen, tuple(zip(xs, values, strict=True)))
