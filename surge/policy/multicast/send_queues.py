"""Turn per-node send queues into a step plan (for trees, chains and naive sends).

In: for each node, the ordered list of (dst, block) it must send.
Out: the steps, built greedily: in every step each node sends the head of its queue
as soon as it holds that block and the receiver is not already receiving.
Also `forest_queues`: the queues of a forest where each node forwards every block,
in block order, to each of its children in turn, and `plan_forest`, which plans such
a forest in numpy, level by level (issue 12: the step-by-step loop is the fallback
for queues that are not a forest rooted at sources).
"""

from collections.abc import Mapping, Sequence

import numpy as np

from surge.policy.multicast.plan import (
    Plan,
    PlanInvariantError,
    Transfer,
    initial_holdings,
    make_plan,
    plan_from_arrays,
)


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


def forest_steps(
    num_nodes: int,
    num_blocks: int,
    num_sources: int,
    children: Mapping[int, Sequence[int]],
    block_order: Sequence[int],
) -> tuple[np.ndarray, ...] | None:
    """`schedule_queues(forest_queues(children, block_order))` as arrays, level by level.

    Returns (step, src, dst, block) arrays, or None unless `children` is a forest rooted
    at sources and `block_order` orders every block once (then use `schedule_queues`).
    In a forest every node has one sender, so no two heads ever want one receiver and
    each node sends its j-th item at s(j) = max(s(j-1) + 1, arrival of its block + 1):
    s(j) = j + max_{i<=j}(arrival_i + 1 - i), a cumulative max over the queue. So
    s(j) - j never falls, hence a node with one child, fed by any sender, gets block i
    no sooner than i steps after block 0: the max is its own term and it forwards each
    block the step after it arrives. A run of such relays (a chain) is done in one go.
    """
    order = np.asarray(list(block_order), dtype=np.int64)
    if not np.array_equal(np.sort(order), np.arange(num_blocks)):
        return None
    kids = {node: list(c) for node, c in children.items() if c}
    parent: dict[int, int] = {}
    for node, cs in kids.items():
        for child in cs:
            if child in parent or child == node or not num_sources <= child < num_nodes:
                return None
            parent[child] = node
    level = sorted(node for node in kids if node not in parent)
    if any(node >= num_sources for node in level):
        return None
    arrival = np.zeros((len(level), num_blocks), dtype=np.int64)  # roots hold every block
    parts: list[tuple[np.ndarray, ...]] = []
    num_done = 0
    while level:
        next_level: list[int] = []
        next_arrival: list[np.ndarray] = []
        relays = [i for i, node in enumerate(level) if len(kids[node]) == 1 and node in parent]
        for row in relays:
            path = _relay_path(level[row], kids)
            num_done += len(path)
            exit_node = kids[path[-1]][0]
            hops = np.arange(1, len(path) + 1, dtype=np.int64)
            step = arrival[row][None, :] + hops[:, None]
            parts.append(
                (
                    step.ravel(),
                    np.repeat(np.asarray(path, dtype=np.int64), num_blocks),
                    np.repeat(np.asarray([*path[1:], exit_node], dtype=np.int64), num_blocks),
                    np.tile(order, len(path)),
                )
            )
            if exit_node in kids:
                next_level.append(exit_node)
                next_arrival.append(step[-1])
        is_relay = set(relays)
        for count in sorted({len(kids[node]) for node in level}):
            rows = [
                i for i, node in enumerate(level) if len(kids[node]) == count and i not in is_relay
            ]
            if not rows:
                continue
            num_done += len(rows)
            senders = np.asarray([level[i] for i in rows], dtype=np.int64)
            receivers = np.asarray([kids[level[i]] for i in rows], dtype=np.int64)
            item = np.arange(count * num_blocks, dtype=np.int64)
            ready = arrival[rows][:, item // count] + 1 - item
            step = item + np.maximum.accumulate(ready, axis=1)
            parts.append(
                (
                    step.ravel(),
                    np.repeat(senders, item.size),
                    receivers[:, item % count].ravel(),
                    np.broadcast_to(order[item // count], step.shape).ravel(),
                )
            )
            for row, node in enumerate(senders.tolist()):
                for rank, child in enumerate(kids[node]):
                    if child in kids:
                        next_level.append(child)
                        next_arrival.append(step[row, rank::count])
        level = next_level
        arrival = np.array(next_arrival, dtype=np.int64).reshape(len(level), num_blocks)
    if num_done != len(kids):
        return None  # a cycle: nodes no source reaches
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))


def _relay_path(first: int, kids: Mapping[int, Sequence[int]]) -> list[int]:
    """`first` and the one-child nodes below it, down to the last one."""
    path = [first]
    while True:
        child = kids[path[-1]][0]
        if len(kids.get(child, ())) != 1 or len(path) > len(kids):
            return path
        path.append(child)


def plan_forest(
    strategy: str,
    num_nodes: int,
    num_blocks: int,
    num_sources: int,
    children: Mapping[int, Sequence[int]],
) -> Plan:
    """The validated plan of a forest where every node forwards each block in layer order."""
    arrays = forest_steps(num_nodes, num_blocks, num_sources, children, range(num_blocks))
    if arrays is None:
        queues = forest_queues(children, range(num_blocks))
        steps = schedule_queues(num_nodes, num_blocks, num_sources, queues)
        return make_plan(strategy, num_nodes, num_blocks, num_sources, steps)
    return plan_from_arrays(strategy, num_nodes, num_blocks, num_sources, *arrays)
