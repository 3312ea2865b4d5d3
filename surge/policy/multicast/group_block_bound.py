"""How long a gloo group's member waits for one block before it gives the group up: the NCCL
baseline's per-block bound, decided here and carried out by `runtime/collective.py`.

In: the bound's settings (`GroupBlockBound`, validated once: `ControllerConfig.group_block_bound`),
what is known of the group's bytes (`group_link`: its largest block and the slowest NIC cap
any member reported), the algorithm, the member's rank and the group's size, and the
scale-out's timeout. Out: `block_timeout_s`, the seconds that member's every block wait is
bounded by (`GroupBroadcastOp.timeout_s`).

Why a bound at all: gloo cannot be woken (its abort does not wake a waiting op and a target's
worker waits in a timed receive), so this bound is how soon a member that died, or a group
given up, is noticed by the rest. Before it was set at the links, that took a quarter of the
scale-out's timeout (30 s of `surge serve`'s 120 s) whatever the block's size (λScale §7.2 and
BlitzScale §5 name NCCL's group as the baseline; neither states a timeout: the factor and
floor are this system's, not a paper's).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from surge.errors import SurgeError
from surge.policy.multicast.topology import NodeLinks

GroupAlgorithm = Literal["broadcast", "ring"]
"""How a group moves the blocks: gloo's broadcast collective (a binomial tree per block) or
NCCL's ring order (a block-pipelined chain over gloo's send/recv)."""


@dataclass(frozen=True)
class GroupBlockBound:
    """A member's wait for one block: `floor_s` + `factor` x the block's expected transfer
    time at the slowest member link per hop, at most `timeout_share` of the scale-out's
    timeout. Validated once."""

    factor: float = 4.0
    """Times the expected transfer time: a `ProcessGroupGloo` runs two worker threads, so two
    blocks' operations of a member are under way at once and share its links (x2), and twice
    that again for a link slower than it says or a loaded host."""
    floor_s: float = 2.0
    """Seconds added: what a block takes beyond its bytes (the members' worker threads and
    event loops, checking it on landing), and the whole bound where the bytes take
    milliseconds."""
    timeout_share: float = 0.25
    """At most this share of the scale-out's timeout (and the whole bound where no member
    reported a link cap): the rest of the scale-out's time is left to pull what is missing."""

    def __post_init__(self) -> None:
        if not (self.factor >= 1 and self.floor_s > 0 and 0 < self.timeout_share <= 1):
            raise SurgeError(
                "group block bound: factor must be >= 1, floor_s > 0 and timeout_share in "
                f"(0, 1] (got {self.factor}, {self.floor_s}, {self.timeout_share})"
            )

    def cap_s(self, scale_out_timeout_s: float) -> float:
        """The longest any of a member's waits may be (a block's, the group's forming)."""
        return scale_out_timeout_s * self.timeout_share


@dataclass(frozen=True)
class GroupLink:
    """What is known of the group's bytes: its largest block, and the slowest link its
    members reported (None: none reported a cap, the bound is the share)."""

    block_bytes: int
    gbps: float | None


def group_link(links: Sequence[NodeLinks], block_bytes: int) -> GroupLink:
    """The slowest NIC cap any member reported (`links`: the members', root first): every
    block crosses the root's egress and each target's ingress, and relays send too."""
    caps = [c for nl in links for c in (nl.egress_gbps, nl.ingress_gbps) if c is not None]
    return GroupLink(block_bytes, min(caps, default=None))


def block_timeout_s(
    link: GroupLink | None,
    bound: GroupBlockBound,
    algorithm: GroupAlgorithm,
    rank: int,
    world_size: int,
    scale_out_timeout_s: float,
) -> float:
    """Rank `rank`'s bound on each block's move: `bound.floor_s` + `bound.factor` x the
    block's expected time, that is its bytes at the slowest link once per hop it waits for:
    gloo's broadcast is a binomial tree of whole blocks, ceil(log2 size) sends from the root
    and as many hops to the deepest rank; on the ring a block reaches rank r after r hops
    and then one arrives per block time (every rank's first wait is its longest). At most
    `bound.timeout_share` of `scale_out_timeout_s`, and that where no link is known."""
    cap_s = bound.cap_s(scale_out_timeout_s)
    if link is None or link.gbps is None:
        return cap_s
    tree_hops = math.ceil(math.log2(world_size))
    hops = max(1, tree_hops if algorithm == "broadcast" else rank)
    expected_s = hops * link.block_bytes * 8 / (link.gbps * 1e9)
    return min(cap_s, bound.floor_s + bound.factor * expected_s)
