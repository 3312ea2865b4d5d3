"""Turn per-node send queues into a step plan (for trees, chains and naive sends).

In: for each node, the ordered list of (dst, block) it must send.
Out: the steps, built greedily: in every step each node sends the head of its queue
as soon as it holds that block and the receiver is not already receiving.
Also `forest_queues`: the queues of a forest where each node forwards every block,
in block order, to each of its children in turn.
"""

from collections.abc import Mapping, Sequence

from surge.policy.plan import PlanInvariantError, Transfer, initial_holdings


def forest_queues(
    children: Mapping[int, Sequence[int]], block_order: Sequence[int]
) -> dict[int, list[tuple[int, int]]]:
    """Queues of a forest: block-major, so a node with c children feeds each every c steps."""
    return {
        node: [(child, block) for block in block_order for child in kids]
        for node, kids in children.items()
        if kids
    }


def schedule_queues(
    num_nodes: int,
    num_blocks: int,
    num_sources: int,
    queues: Mapping[int, Sequence[tuple[int, int]]],
) -> list[list[Transfer]]:
    """Run the queues step by step; raise `PlanInvariantError` if they deadlock."""
    held = initial_holdings(num_nodes, num_blocks, num_sources)
    heads = dict.fromkeys(queues, 0)
    steps: list[list[Transfer]] = []
    while any(heads[n] < len(queues[n]) for n in queues):
        receiving: set[int] = set()
        transfers: list[Transfer] = []
        for node in sorted(queues):
            if heads[node] == len(queues[node]):
                continue
            dst, block = queues[node][heads[node]]
            if block in held[node] and dst not in receiving:
                transfers.append(Transfer(node, dst, block))
                receiving.add(dst)
                heads[node] += 1
        if not transfers:
            stuck = {n: queues[n][heads[n]] for n in queues if heads[n] < len(queues[n])}
            raise PlanInvariantError(f"send queues deadlock; waiting heads: {stuck}")
        for tr in transfers:
            held[tr.dst].add(tr.block)
        steps.append(transfers)
    return steps
