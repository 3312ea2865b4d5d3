"""Binomial-pipeline multicast over a hypercube, for any N and K sources.

In: N nodes, B blocks, K sources.
Out: a `Plan` that completes in exactly B + ceil(log2 ceil(N/K)) - 1 steps, which is
the lower bound of the step model (see `binomial_step_bound`).

λScale §3 / §4.2 (after Ganesan & Seshadri's binomial pipeline, as RDMC implements it):
the nodes of a sub-group of L = 2^l nodes sit on the vertices of an l-dimensional
hypercube with the source at vertex 0. In step t (from 0) every vertex pairs with its
neighbour across dimension d_t = t mod l. The source injects block t; each block then
spreads through a binomial tree over the next l-1 dimensions and reaches the other
half of the cube across its own dimension again l steps after injection. Every node
receives one block per step, so the last block arrives at step B + l - 1. Blocks past
the last are replaced by the last block, which is how the schedule finishes exactly
then (blocks a node already holds are not sent).

For 2^l < L < 2^(l+1) the same cube carries L nodes: vertices 1..L-2^l hold two nodes
("twins", node v and node v + 2^l - 1). Per step one twin receives the vertex's
incoming block while the other sends the vertex's outgoing block and receives from
its twin the one block it lacks; each twin lacks at most one of the vertex's blocks
at any time, so one extra exchange step finishes: B + l steps = B + ceil(log2 L) - 1.

With K sources the nodes form K sub-groups (`split_subgroups`), each a 1 -> L
multicast in λScale's k-way block order (`kway_block_orders`), all in parallel.
Given link speeds, the fastest destinations take the positions that receive first.
"""

from surge.errors import SurgeError
from surge.policy.cluster import Cluster
from surge.policy.plan import Plan, PlanInvariantError, Transfer, make_plan
from surge.policy.subgroups import check_sizes, kway_block_orders, split_subgroups

STRATEGY = "binomial"


def binomial_step_bound(num_nodes: int, num_blocks: int, num_sources: int = 1) -> int:
    """Steps any plan needs, and exactly what `plan_binomial` takes: B + ceil(log2(N/K)) - 1.

    Proof of the lower bound: after s steps at most K * 2^s nodes hold any block, so
    some destination first receives at step >= ceil(log2(N/K)) and still needs B-1 more
    blocks, one per step. ceil(log2(N/K)) == ceil(log2(ceil(N/K))) == (L-1).bit_length()
    for the largest sub-group size L = ceil(N/K).
    """
    largest_subgroup = -(-num_nodes // num_sources)
    return num_blocks + (largest_subgroup - 1).bit_length() - 1


def _hypercube_step(step: int, num_dims: int) -> list[tuple[int, int, int]]:
    """(src vertex, dst vertex, virtual block) of one hypercube step.  # λScale §3, RDMC

    Virtual block x >= B stands for the last block; callers clamp it.
    """
    dim = step % num_dims
    moves: list[tuple[int, int, int]] = []
    for high in range(1 << num_dims):
        if not high >> dim & 1:
            continue
        low = high ^ (1 << dim)
        if low == 0:
            moves.append((0, high, step))  # the source injects a new block
        else:
            # Block step-m spreads across d_step to the vertices whose first set bit,
            # scanning dimensions d_{step-l+1} .. d_{step-1}, is d_{step-m}.
            for m in range(num_dims - 1, 0, -1):
                if high >> ((step - m) % num_dims) & 1:
                    if step - m >= 0:
                        moves.append((low, high, step - m))
                    break
            if step - num_dims >= 0:
                # Block step-l, held by the whole half with bit d set, crosses back.
                moves.append((high, low, step - num_dims))
    return moves


def _subgroup_steps(group_size: int, order: list[int]) -> list[list[tuple[int, int, int]]]:
    """Steps of a 1 -> L binomial multicast in local node ids (0 = source)."""
    num_blocks = len(order)
    if group_size == 1:
        return []
    num_dims = group_size.bit_length() - 1
    num_vertices = 1 << num_dims
    twin_of = {v: v + num_vertices - 1 for v in range(1, group_size - num_vertices + 1)}
    held: list[set[int]] = [set(order) if n == 0 else set() for n in range(group_size)]
    steps: list[list[tuple[int, int, int]]] = []

    for step in range(num_blocks + num_dims - 1):
        moves = [
            (src, dst, order[min(x, num_blocks - 1)])
            for src, dst, x in _hypercube_step(step, num_dims)
        ]
        outgoing = {src: block for src, _, block in moves}
        sender: dict[int, int] = {}
        receiver: dict[int, int] = {}
        for vertex in range(num_vertices):
            if vertex not in twin_of:
                sender[vertex] = receiver[vertex] = vertex
                continue
            a, b = vertex, twin_of[vertex]
            block = outgoing.get(vertex)
            if block is None or block in held[a]:
                sender[vertex], receiver[vertex] = a, b
            else:
                sender[vertex], receiver[vertex] = b, a
        transfers: list[tuple[int, int, int]] = []
        busy_in: set[int] = set()
        busy_out: set[int] = set()
        for src_v, dst_v, block in moves:
            src, dst = sender[src_v], receiver[dst_v]
            if block not in held[dst]:
                transfers.append((src, dst, block))
                busy_out.add(src)
                busy_in.add(dst)
        for vertex in twin_of:
            for src, dst in (
                (receiver[vertex], sender[vertex]),
                (sender[vertex], receiver[vertex]),
            ):
                missing = sorted(held[src] - held[dst])
                if missing and src not in busy_out and dst not in busy_in:
                    transfers.append((src, dst, missing[0]))
                    busy_out.add(src)
                    busy_in.add(dst)
        _apply(held, transfers)
        steps.append(transfers)
        _check_twins(held, twin_of)

    # One exchange step gives each twin the single block it still lacks.
    final = []
    for a, b in twin_of.items():
        for src, dst in ((a, b), (b, a)):
            missing = sorted(held[src] - held[dst])
            if missing:
                final.append((src, dst, missing[0]))
    _apply(held, final)
    if final:
        steps.append(final)
    if any(len(h) != num_blocks for h in held):
        raise PlanInvariantError(f"binomial sub-group of {group_size} left nodes incomplete")
    return steps


def _apply(held: list[set[int]], transfers: list[tuple[int, int, int]]) -> None:
    for _, dst, block in transfers:
        held[dst].add(block)


def _check_twins(held: list[set[int]], twin_of: dict[int, int]) -> None:
    """Each twin lacks at most one block of its vertex, and never the same one."""
    for a, b in twin_of.items():
        only_a, only_b = held[a] - held[b], held[b] - held[a]
        if len(only_a) > 1 or len(only_b) > 1:
            raise PlanInvariantError(f"twins {a},{b} drifted apart: {only_a} vs {only_b}")


def _place_by_speed(
    group: list[int], local_steps: list[list[tuple[int, int, int]]], cluster: Cluster
) -> list[int]:
    """Map local roles to nodes so the fastest destinations take the earliest roles.

    Roles are ranked by the step of their first block (then local id): the source's
    neighbours come first, and they carry most forwarding. Destinations are ranked by
    min(egress, ingress), fastest first; equal speeds keep id order, so on uniform links
    the placement is the identity.
    """
    destinations = group[1:]
    speed = {n: min(cluster.egress_gbps[n], cluster.ingress_gbps[n]) for n in destinations}
    if len(set(speed.values())) <= 1:
        return group
    first_step: dict[int, int] = {}
    for index, transfers in enumerate(local_steps):
        for _, dst, _ in transfers:
            first_step.setdefault(dst, index)
    roles = sorted(range(1, len(group)), key=lambda r: (first_step[r], r))
    fastest = sorted(destinations, key=lambda n: (-speed[n], n))
    placed = [group[0], *destinations]
    for role, node in zip(roles, fastest, strict=True):
        placed[role] = node
    return placed


def plan_binomial(
    num_nodes: int, num_blocks: int, num_sources: int = 1, cluster: Cluster | None = None
) -> Plan:
    """Binomial-pipeline plan; with K > 1, K sub-groups in λScale's k-way order (Alg. 1).

    With a `cluster`, the fastest destinations of each sub-group take the hypercube
    positions that receive first (`_place_by_speed`); the step count is unchanged.
    """
    check_sizes(num_nodes, num_blocks, num_sources)
    if cluster is not None and cluster.num_nodes != num_nodes:
        raise SurgeError(f"cluster describes {cluster.num_nodes} nodes, plan has {num_nodes}")
    groups = split_subgroups(num_nodes, num_sources)
    orders = kway_block_orders(num_blocks, num_sources)
    steps: list[list[Transfer]] = []
    for group, order in zip(groups, orders, strict=True):
        local_steps = _subgroup_steps(len(group), order)
        nodes = group if cluster is None else _place_by_speed(group, local_steps, cluster)
        for index, local in enumerate(local_steps):
            if index == len(steps):
                steps.append([])
            steps[index].extend(Transfer(nodes[s], nodes[d], blk) for s, d, blk in local)
    plan = make_plan(STRATEGY, num_nodes, num_blocks, num_sources, steps)
    bound = binomial_step_bound(num_nodes, num_blocks, num_sources)
    if plan.complete_step != bound:
        raise PlanInvariantError(f"binomial took {plan.complete_step} steps, bound is {bound}")
    return plan
