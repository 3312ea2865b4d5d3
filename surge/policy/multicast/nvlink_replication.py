"""λScale's binomial multicast with intra-node replication over NVLink.  # λScale §4.3 Case 3

In: N nodes, B blocks, K sources and the `Cluster` (its NVLink groups: nodes of one
machine). Out: `replicates_over_nvlink` (whether Case 3 applies), `plan_binomial_nvlink`
(the `Plan`) and `replica_pipeline_groups` (the node groups of λScale Alg. 2's pipelines,
one per local replica: Fig. 6c); and Case 2's `shards_per_block` (a multi-GPU member's
lead GPU passes each block's shards on as it lands; the simulator carries it out).
`scale_out.plan_multicast` and `plan_pipelines` call the Case 3 functions for the
`binomial` strategy; both bodies get the same plan from the same `Cluster` (the
simulator's machines, `surge serve`'s host groups).

λScale §4.3 Case 3: "as soon as the first GPU receives model blocks, it can quickly
replicate them to other local GPUs using ... NVLink, which offers bandwidth up to an order
of magnitude higher than RDMA networks ... Replicated model blocks can then form
cross-node execution pipelines (Case 1)." So the binomial pipeline runs over network
*units* (`nvlink_units.target_units`, the same collapse BlitzScale's chains use): one
receiver per machine, plus every source. Each unit's other GPUs get every block over a
pipelined NVLink chain (head -> mate 1 -> mate 2 ...), block by block in the order the
head received them; a machine holding a source chains its targets off that source.

Step model (`plan.py`: one send and one receive per node and step): unit step t becomes
network step 2t-1; the NVLink hops run in the even steps between, so a head's network
sends and its NVLink sends alternate and no port carries two transfers at once. Execution
is self-timed in both bodies, so an NVLink hop (a block at `nvlink_gbps`, ~16x the NIC)
delays the head's next network send by only its own short time.
"""

from collections.abc import Sequence

import numpy as np

from surge.policy.multicast.binomial import STRATEGY, plan_binomial
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.nvlink_units import target_units
from surge.policy.multicast.pipelines import kway_pipeline_groups
from surge.policy.multicast.plan import Plan, arrival_matrix, plan_from_arrays
from surge.policy.multicast.subgroups import check_sizes, split_subgroups


def replicates_over_nvlink(num_sources: int, cluster: Cluster | None) -> bool:
    """Case 3 applies: some target shares its machine with another node of the multicast,
    and the machine's link is faster than that target's network ingress ("opportunistically",
    λScale §4.3: only where a fast local link exists)."""
    if cluster is None or not cluster.nvlink_groups:
        return False
    for group in cluster.nvlink_groups:
        targets = [g for g in group if g >= num_sources]
        if targets and cluster.nvlink_gbps > max(cluster.ingress_gbps[t] for t in targets):
            return True
    return False


def _unit_nodes(num_sources: int, cluster: Cluster) -> tuple[list[int], list[list[int]]]:
    """(plan nodes of the unit multicast: sources, then each unit's head), and every
    NVLink chain ([feeder, mates...]: a unit's members, or a source's local chain)."""
    units, local_chains = target_units(num_sources, cluster)
    nodes = [*range(num_sources), *(u[0] for u in units)]
    return nodes, [u for u in units if len(u) > 1] + local_chains


def _unit_cluster(cluster: Cluster, nodes: Sequence[int]) -> Cluster:
    return Cluster(
        egress_gbps=tuple(cluster.egress_gbps[v] for v in nodes),
        ingress_gbps=tuple(cluster.ingress_gbps[v] for v in nodes),
    )


def plan_binomial_nvlink(
    num_nodes: int, num_blocks: int, num_sources: int, cluster: Cluster
) -> Plan:
    """The binomial plan over network units, each unit's mates fed over NVLink (see the
    module docstring). Strategy name `binomial`: it is λScale's plan on this hardware."""
    check_sizes(num_nodes, num_blocks, num_sources)
    nodes, chains = _unit_nodes(num_sources, cluster)
    to_node = np.asarray(nodes, dtype=np.int64)
    parts: list[tuple[np.ndarray, ...]] = []
    # received[node] = (unit step, block) of each block in the order the node gets it;
    # a source holds every block, in layer order, "received" at steps 1..B for its chain.
    received: dict[int, list[tuple[int, int]]] = {
        s: [(b + 1, b) for b in range(num_blocks)] for s in range(num_sources)
    }
    if len(nodes) > num_sources:
        units = plan_binomial(len(nodes), num_blocks, num_sources, _unit_cluster(cluster, nodes))
        arr = units.arrays
        parts.append((2 * arr.step - 1, to_node[arr.src], to_node[arr.dst], arr.block))
        arrival = arrival_matrix(units)
        for u in range(num_sources, len(nodes)):
            row = arrival[u]
            received[nodes[u]] = sorted((int(row[b]), b) for b in range(num_blocks))
    for chain in chains:
        # Hop j of the chain carries the block the feeder got at unit step r in even step
        # 2(r + j): one block per hop and step, each hop one step behind the one before.
        seq = received[chain[0]]
        rounds = np.asarray([r for r, _ in seq], dtype=np.int64)
        blocks = np.asarray([b for _, b in seq], dtype=np.int64)
        for j in range(len(chain) - 1):
            parts.append(
                (
                    2 * (rounds + j),
                    np.full(len(seq), chain[j], dtype=np.int64),
                    np.full(len(seq), chain[j + 1], dtype=np.int64),
                    blocks,
                )
            )
    step, src, dst, block = (np.concatenate([p[i] for p in parts]) for i in range(4))
    return plan_from_arrays(STRATEGY, num_nodes, num_blocks, num_sources, step, src, dst, block)


def replica_pipeline_groups(num_sources: int, cluster: Cluster) -> list[list[int]]:
    """λScale Alg. 2's pipeline groups on the units, one group per local replica (Fig. 6c:
    "each local model block replica forms a separate cross-node execution pipeline"): the
    j-th GPU of every unit in an Alg. 2 group forms one group (two nodes at least)."""
    nodes, _ = _unit_nodes(num_sources, cluster)
    units, _ = target_units(num_sources, cluster)
    members = {num_sources + i: u for i, u in enumerate(units)}
    groups: list[list[int]] = []
    for unit_group in kway_pipeline_groups(split_subgroups(len(nodes), num_sources)):
        for j in range(max(len(members[u]) for u in unit_group)):
            group = [members[u][j] for u in unit_group if len(members[u]) > j]
            if len(group) >= 2:
                groups.append(group)
    return groups


def shards_per_block(shard_multicast: bool, gpus_per_member: int) -> bool:
    """λScale §4.3 Case 2 ("GPUs that have received complete blocks can immediately begin
    forming execution pipelines across nodes"): a member of several GPUs whose lead GPU
    receives whole blocks passes each block's shards to its other GPUs as the block lands,
    so it holds complete blocks for a tensor-parallel stage at once. False for one GPU, or
    when every GPU pulls its own shard over its own NIC (`shard_multicast`, BlitzScale)."""
    return gpus_per_member > 1 and not shard_multicast
