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
    """Run the queues step by step; raise `PlanInvariantError` if they deadlock.

    Only nodes whose head block is already held are visited (in node order, each
    step); a node whose head is missing waits until that block arrives. Same steps
    as visiting every node every step, in time proportional to the transfers.
    """
    held = initial_holdings(num_nodes, num_blocks, num_sources)
    heads = dict.fromkeys(queues, 0)
    ready: set[int] = set()
    waiting: dict[int, int] = {}  # node -> the block its head waits for
    for node, queue in queues.items():
        if queue:
            _enqueue_head(node, queue[0][1], held, ready, waiting)
    steps: list[list[Transfer]] = []
    while ready or waiting:
        if not ready:
            stuck = {n: queues[n][heads[n]] for n in queues if n in waiting}
            raise PlanInvariantError(f"send queues deadlock; waiting heads: {stuck}")
        receiving: set[int] = set()
        transfers: list[Transfer] = []
        for node in sorted(ready):
            queue = queues[node]
            dst, block = queue[heads[node]]
            if dst not in receiving:
                transfers.append(Transfer(node, dst, block))
                receiving.add(dst)
                heads[node] += 1
        for tr in transfers:
            held[tr.dst].add(tr.block)
        for tr in transfers:
            queue, head = queues[tr.src], heads[tr.src]
            ready.discard(tr.src)
            if head < len(queue):
                _enqueue_head(tr.src, queue[head][1], held, ready, waiting)
            if waiting.get(tr.dst) == tr.block:
                del waiting[tr.dst]
                ready.add(tr.dst)
        steps.append(transfers)
    return steps


def _enqueue_head(
    node: int, block: int, held: list[set[int]], ready: set[int], waiting: dict[int, int]
) -> None:
    """File `node` as ready (it holds its head block) or as waiting for that block."""
    if block in held[node]:
        ready.add(node)
    else:
        waiting[node] = block
