"""A multicast's targets as network units: the NVLink groups of one machine collapsed.

In: K (nodes 0..K-1 are sources) and the `Cluster` (its NVLink groups, busy egress).
Out: `target_units` -> (units, local_chains): each unit is a list of targets whose first
node receives from the network and whose others are fed over NVLink inside their machine;
each local chain is [a free source, its group's targets...], fed entirely over NVLink.

One notion, two planners: BlitzScale's chains (§5.1 Alg. 1, "GPUs of one machine are fed
by one network transfer and a local broadcast", `multicast/chain.py`) and λScale's
binomial pipeline with intra-node replication (§4.3 Case 3, `multicast/nvlink_replication.py`:
"as soon as the first GPU receives model blocks, it can quickly replicate them to other
local GPUs using ... NVLink").
"""

from surge.policy.multicast.cluster import Cluster


def target_units(num_sources: int, cluster: Cluster) -> tuple[list[list[int]], list[list[int]]]:
    """Network targets as units (NVLink groups collapsed), and NVLink-local chains.

    A group holding a free source chains its targets off that source; otherwise the
    target with the fastest ingress (ties: the lowest) receives from the network and the
    others follow it. Targets in no group are units of one. Units come in group order,
    then the lone targets in node order."""
    free_sources = [s for s in range(num_sources) if s not in cluster.busy_egress]
    units: list[list[int]] = []
    local_chains: list[list[int]] = []
    placed: set[int] = set()
    for group in cluster.nvlink_groups:
        targets = sorted(g for g in group if g >= num_sources)
        group_sources = [g for g in sorted(group) if g in free_sources]
        if group_sources and targets:
            local_chains.append([group_sources[0], *targets])
        elif targets:
            head = min(targets, key=lambda t: (-cluster.ingress_gbps[t], t))
            units.append([head, *[t for t in targets if t != head]])
        placed |= set(targets)
    units += [[t] for t in range(num_sources, cluster.num_nodes) if t not in placed]
    return units, local_chains
