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

Speed (issue 12): a sub-group's steps are computed once per sub-group size, with numpy
over all hypercube vertices at once, in block positions (which block comes i-th in
the group's order); each sub-group then maps positions to its blocks and roles to its
nodes. Positions are enough because a twin never lacks more than one block of its
vertex, so "the smallest missing block" never depends on the order.
"""

import functools

import numpy as np

from surge.errors import SurgeError
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.plan import Plan, PlanInvariantError, plan_from_arrays
from surge.policy.multicast.subgroups import check_sizes, kway_block_orders, split_subgroups

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


def _hypercube_step(step: int, num_dims: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src vertices, dst vertices, virtual blocks) of one hypercube step.  # λScale §3, RDMC

    Virtual block x >= B stands for the last block; callers clamp it.
    """
    bit = 1 << (step % num_dims)
    vertices = np.arange(1 << num_dims, dtype=np.int64)
    high = vertices[(vertices & bit) != 0]
    low = high ^ bit
    inner = low != 0
    # Block step-m spreads across d_step to the vertices whose first set bit, scanning
    # dimensions d_{step-l+1} .. d_{step-1}, is d_{step-m}: the largest such m wins.
    spread_m = np.zeros(high.size, dtype=np.int64)
    for m in range(num_dims - 1, 0, -1):
        unset = (spread_m == 0) & ((high >> ((step - m) % num_dims)) & 1 == 1)
        spread_m[unset] = m
    spreads = inner & (spread_m > 0) & (step - spread_m >= 0)
    srcs = [np.zeros(1, dtype=np.int64), low[spreads]]  # the source injects a new block
    dsts = [np.array([bit], dtype=np.int64), high[spreads]]
    blocks = [np.array([step], dtype=np.int64), step - spread_m[spreads]]
    if step - num_dims >= 0:
        # Block step-l, held by the whole half with bit d set, crosses back.
        srcs.append(high[inner])
        dsts.append(low[inner])
        blocks.append(np.full(int(inner.sum()), step - num_dims, dtype=np.int64))
    return np.concatenate(srcs), np.concatenate(dsts), np.concatenate(blocks)


def _first_missing(
    held: np.ndarray, src: np.ndarray, dst: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per pair, whether src holds a block dst lacks, and the smallest such block."""
    missing = held[src] & ~held[dst]
    return missing.any(axis=1), missing.argmax(axis=1)


@functools.lru_cache(maxsize=8)
def _subgroup_steps(group_size: int, num_blocks: int) -> tuple[np.ndarray, ...]:
    """Transfers of a 1 -> L binomial multicast in local node ids (0 = source).

    Returns arrays (step index from 0, src, dst, block position); position i stands for
    the i-th block of the group's order.
    """
    empty = np.zeros(0, dtype=np.int64)
    if group_size == 1:
        return empty, empty, empty, empty
    num_dims = group_size.bit_length() - 1
    num_vertices = 1 << num_dims
    twin_a = np.arange(1, group_size - num_vertices + 1, dtype=np.int64)
    twin_b = twin_a + num_vertices - 1
    held = np.zeros((group_size, num_blocks), dtype=bool)
    held[0] = True
    out: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []

    for step in range(num_blocks + num_dims - 1):
        move_src, move_dst, virtual = _hypercube_step(step, num_dims)
        move_block = np.minimum(virtual, num_blocks - 1)
        # Per vertex the twin that sends and the twin that receives: the first twin
        # sends unless it lacks the vertex's outgoing block.
        sender = np.arange(num_vertices, dtype=np.int64)
        receiver = sender.copy()
        if twin_a.size:
            outgoing = np.full(num_vertices, -1, dtype=np.int64)
            outgoing[move_src] = move_block
            out_block = outgoing[twin_a]
            a_sends = (out_block < 0) | held[twin_a, np.maximum(out_block, 0)]
            sender[twin_a] = np.where(a_sends, twin_a, twin_b)
            receiver[twin_a] = np.where(a_sends, twin_b, twin_a)
        src, dst = sender[move_src], receiver[move_dst]
        keep = ~held[dst, move_block]
        srcs, dsts, blocks = [src[keep]], [dst[keep]], [move_block[keep]]
        if twin_a.size:
            busy_out = np.zeros(group_size, dtype=bool)
            busy_in = np.zeros(group_size, dtype=bool)
            busy_out[srcs[0]] = True
            busy_in[dsts[0]] = True
            s, r = sender[twin_a], receiver[twin_a]
            # The twins swap what one lacks, each way where both ports are still free.
            for a, b in ((r, s), (s, r)):
                has, first = _first_missing(held, a, b)
                ok = has & ~busy_out[a] & ~busy_in[b]
                srcs.append(a[ok])
                dsts.append(b[ok])
                blocks.append(first[ok])
                busy_out[a[ok]] = True
                busy_in[b[ok]] = True
        step_src, step_dst, step_block = map(np.concatenate, (srcs, dsts, blocks))
        held[step_dst, step_block] = True
        out.append((step, step_src, step_dst, step_block))
        if twin_a.size:
            _check_twins(held, twin_a, twin_b)

    # One exchange step gives each twin the single block it still lacks.
    final = [(*_first_missing(held, a, b), a, b) for a, b in ((twin_a, twin_b), (twin_b, twin_a))]
    final_src = np.concatenate([a[has] for has, _, a, _ in final])
    if final_src.size:
        final_dst = np.concatenate([b[has] for has, _, _, b in final])
        final_block = np.concatenate([first[has] for has, first, _, _ in final])
        held[final_dst, final_block] = True
        out.append((num_blocks + num_dims - 1, final_src, final_dst, final_block))
    if not held.all():
        raise PlanInvariantError(f"binomial sub-group of {group_size} left nodes incomplete")
    step_ids = np.concatenate([np.full(s.size, t, dtype=np.int64) for t, s, _, _ in out])
    result = (step_ids, *(np.concatenate([o[i] for o in out]) for i in (1, 2, 3)))
    for array in result:
        array.flags.writeable = False  # cached: shared by every call
    return result


def _check_twins(held: np.ndarray, twin_a: np.ndarray, twin_b: np.ndarray) -> None:
    """Each twin lacks at most one block of its vertex, and never the same one."""
    only_a = (held[twin_a] & ~held[twin_b]).sum(axis=1)
    only_b = (held[twin_b] & ~held[twin_a]).sum(axis=1)
    drifted = np.flatnonzero((only_a > 1) | (only_b > 1))
    if drifted.size:
        a, b = int(twin_a[drifted[0]]), int(twin_b[drifted[0]])
        raise PlanInvariantError(
            f"twins {a},{b} drifted apart: {only_a[drifted[0]]} vs "
            f"{only_b[drifted[0]]} blocks only one of them holds"
        )


def _place_by_speed(
    group: list[int], local_dst: np.ndarray, local_step: np.ndarray, cluster: Cluster
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
    first_step = np.full(len(group), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_step, local_dst, local_step)
    roles = np.arange(1, len(group), dtype=np.int64)
    roles = roles[np.lexsort((roles, first_step[1:]))].tolist()
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
    orders = np.array(kway_block_orders(num_blocks, num_sources), dtype=np.int64)
    parts: list[tuple[np.ndarray, ...]] = []
    for size in sorted({len(g) for g in groups}):
        local_step, local_src, local_dst, local_pos = _subgroup_steps(size, num_blocks)
        picked = [i for i, g in enumerate(groups) if len(g) == size]
        nodes = np.array(
            [
                groups[i]
                if cluster is None
                else _place_by_speed(groups[i], local_dst, local_step, cluster)
                for i in picked
            ],
            dtype=np.int64,
        )
        # One row per sub-group of this size, one column per local transfer.
        parts.append(
            (
                np.broadcast_to(local_step, (len(picked), local_step.size)).ravel(),
                nodes[:, local_src].ravel(),
                nodes[:, local_dst].ravel(),
                orders[picked][:, local_pos].ravel(),
            )
        )
    step, src, dst, block = (np.concatenate([p[i] for p in parts]) for i in range(4))
    plan = plan_from_arrays(STRATEGY, num_nodes, num_blocks, num_sources, step + 1, src, dst, block)
    bound = binomial_step_bound(num_nodes, num_blocks, num_sources)
    if plan.complete_step != bound:
        raise PlanInvariantError(f"binomial took {plan.complete_step} steps, bound is {bound}")
    return plan
