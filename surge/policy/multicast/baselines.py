"""Baseline multicasts: FaaSNet's binary tree and naive source-sends-everything.

In: N nodes, B blocks, K sources.
Out: a `Plan` per baseline. Both split the nodes into the same K sub-groups as the
binomial strategy (`split_subgroups`), one source each.

- `binary-tree` (FaaSNet, as λScale §7 compares): each sub-group is a binary tree in
  heap order rooted at its source; every node forwards each block, in layer order, to
  its left then right child. About 2B + 2 log2(L) steps.
- `naive`: each source sends every block to each of its destinations in turn,
  destination by destination: ceil((N-K)/K) * B steps.
"""

import numpy as np

from surge.policy.multicast.plan import Plan, plan_from_arrays
from surge.policy.multicast.send_queues import plan_forest
from surge.policy.multicast.subgroups import check_sizes, split_subgroups

BINARY_TREE = "binary-tree"
NAIVE = "naive"


def plan_binary_tree(num_nodes: int, num_blocks: int, num_sources: int = 1) -> Plan:
    """FaaSNet-style binary tree per sub-group, pipelined block by block."""
    check_sizes(num_nodes, num_blocks, num_sources)
    children: dict[int, list[int]] = {}
    for group in split_subgroups(num_nodes, num_sources):
        for index, node in enumerate(group):
            children[node] = [group[c] for c in (2 * index + 1, 2 * index + 2) if c < len(group)]
    return plan_forest(BINARY_TREE, num_nodes, num_blocks, num_sources, children)


def plan_naive(num_nodes: int, num_blocks: int, num_sources: int = 1) -> Plan:
    """Sources send all blocks to one destination after another; destinations never forward."""
    check_sizes(num_nodes, num_blocks, num_sources)
    # Each source holds everything and is its destinations' only sender, so it sends
    # its i-th (destination, block) in step i+1 (what `schedule_queues` gives).
    parts = []
    for group in split_subgroups(num_nodes, num_sources):
        dsts = np.repeat(np.asarray(group[1:], dtype=np.int64), num_blocks)
        parts.append(
            (
                np.arange(1, dsts.size + 1, dtype=np.int64),
                np.full(dsts.size, group[0], dtype=np.int64),
                dsts,
                np.tile(np.arange(num_blocks, dtype=np.int64), len(group) - 1),
            )
        )
    step, src, dst, block = (np.concatenate([p[i] for p in parts]) for i in range(4))
    return plan_from_arrays(NAIVE, num_nodes, num_blocks, num_sources, step, src, dst, block)
