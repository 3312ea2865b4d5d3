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

from surge.policy.plan import Plan, make_plan
from surge.policy.send_queues import forest_queues, schedule_queues
from surge.policy.subgroups import check_sizes, split_subgroups

BINARY_TREE = "binary-tree"
NAIVE = "naive"


def plan_binary_tree(num_nodes: int, num_blocks: int, num_sources: int = 1) -> Plan:
    """FaaSNet-style binary tree per sub-group, pipelined block by block."""
    check_sizes(num_nodes, num_blocks, num_sources)
    children: dict[int, list[int]] = {}
    for group in split_subgroups(num_nodes, num_sources):
        for index, node in enumerate(group):
            children[node] = [group[c] for c in (2 * index + 1, 2 * index + 2) if c < len(group)]
    queues = forest_queues(children, range(num_blocks))
    steps = schedule_queues(num_nodes, num_blocks, num_sources, queues)
    return make_plan(BINARY_TREE, num_nodes, num_blocks, num_sources, steps)


def plan_naive(num_nodes: int, num_blocks: int, num_sources: int = 1) -> Plan:
    """Sources send all blocks to one destination after another; destinations never forward."""
    check_sizes(num_nodes, num_blocks, num_sources)
    queues = {
        group[0]: [(dst, block) for dst in group[1:] for block in range(num_blocks)]
        for group in split_subgroups(num_nodes, num_sources)
    }
    steps = schedule_queues(num_nodes, num_blocks, num_sources, queues)
    return make_plan(NAIVE, num_nodes, num_blocks, num_sources, steps)
