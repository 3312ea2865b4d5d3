"""Re-planning a failed delivery of a multicast: which live holder a receiver pulls from.

In: the failed pull (receiver `node`, `block`, the source that failed it), which plan nodes
are alive and which blocks each holds now, and how many plan nodes are sources (plan nodes
0..K-1, which hold everything). Out: the plan node to pull from instead, or None while no
live node but the failed one holds the block (the caller waits for one to arrive).
Rule: sources first (they hold every block from the start and forward nothing they are
still receiving), then the lowest plan node, the earliest in the plan's order among the
receivers that hold it. Pure.

`surge serve` carries it out (`runtime/multicast.py` `MulticastExecutor`, a `pull_from` to the
receiver); the simulator has no failed pulls (its nodes and links do not fail), so nothing
there re-plans (docs/architecture.md).
"""

from collections.abc import Sequence


def replan_source(
    node: int,
    block: int,
    failed_src: int,
    holds: Sequence[set[int] | frozenset[int]],
    alive: Sequence[bool],
    num_sources: int,
) -> int | None:
    """The plan node `node` pulls `block` from instead of `failed_src` (see the module)."""
    holders = [
        v
        for v in range(len(holds))
        if v not in (node, failed_src) and alive[v] and block in holds[v]
    ]
    if not holders:
        return None
    return min(holders, key=lambda v: (v >= num_sources, v))
