"""BlitzScale's serial forwarding chains.  # BlitzScale §5.1, Alg. 1

In: N nodes, B blocks, K sources, and the `Cluster` (bandwidths, NVLink groups, busy
egress).
Out: `build_chains` -> who forwards to whom (a forest), and `plan_chain` -> the `Plan`.

Alg. 1, greedily: (1) targets joined by NVLink collapse into one target (the member
with the fastest ingress receives from the network; the others are fed by a local
broadcast, here a pipelined NVLink chain through the group whose last member forwards
onward, so no port carries two flows); (2) sources whose egress carries serving
traffic are pruned; (3) targets, fastest ingress first, are each attached to the
sender that can feed them fastest (ties: first inserted, which keeps chains short and
spreads targets over the sources); the target becomes a sender at the rate it
receives, capped by its own egress (Alg. 1 leaves the cap implicit). Alg. 1 also puts
a sender with spare bandwidth back to feed a second chain; in the issue's one-port
model a port carries one flow at a time, so splitting a port only slows both chains
and we leave it out: K free sources give K chains. Targets in an NVLink group that
holds a free source are chained off that source over NVLink instead, and the network
chain then starts at the last of them.

One source on uniform links gives one chain: B + N - 2 steps.
"""

import heapq
import itertools
from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.nvlink_units import target_units
from surge.policy.multicast.plan import Plan
from surge.policy.multicast.send_queues import plan_forest
from surge.policy.multicast.subgroups import check_sizes

STRATEGY = "chain"


@dataclass(frozen=True)
class Chains:
    """The forest Alg. 1 builds."""

    children: dict[int, tuple[int, ...]]
    """node -> the nodes it forwards every block to, in order."""
    pruned_sources: tuple[int, ...]
    """Sources left out because their egress is busy with serving traffic."""


def build_chains(num_nodes: int, num_sources: int, cluster: Cluster) -> Chains:
    """Greedy chain construction of BlitzScale Alg. 1 (see module docstring)."""
    if cluster.num_nodes != num_nodes:
        raise SurgeError(f"cluster describes {cluster.num_nodes} nodes, plan has {num_nodes}")
    pruned = tuple(s for s in range(num_sources) if s in cluster.busy_egress)
    if len(pruned) == num_sources:
        raise SurgeError(
            "every source's egress is busy with serving traffic; add a source whose "
            "egress is free (BlitzScale prunes busy sources)"
        )
    units, local_chains = target_units(num_sources, cluster)
    children: dict[int, list[int]] = {node: [] for node in range(num_nodes)}
    # A source with an NVLink chain feeds the network through that chain's last node.
    network_sender = {s: s for s in range(num_sources)}
    for chain in local_chains:
        for a, b in itertools.pairwise(chain):
            children[a].append(b)
        network_sender[chain[0]] = chain[-1]

    # D_src: a max-heap on the rate a sender can feed, ties by insertion order.
    counter = 0
    senders: list[tuple[float, int, int]] = []
    for s in range(num_sources):
        if s in pruned:
            continue
        exit_node = network_sender[s]
        heapq.heappush(senders, (-cluster.egress_gbps[exit_node], counter, exit_node))
        counter += 1
    # D_tgt: fastest ingress first.
    units.sort(key=lambda u: (-cluster.ingress_gbps[u[0]], u[0]))
    for unit in units:  # Lines 4-12
        negative_rate, _, sender = heapq.heappop(senders)
        rate = min(-negative_rate, cluster.ingress_gbps[unit[0]])  # Line 6
        children[sender].append(unit[0])  # Line 8
        for a, b in itertools.pairwise(unit):
            children[a].append(b)
        # Line 9 re-pushes a sender with spare bandwidth; one port carries one flow here.
        exit_node = unit[-1]
        heapq.heappush(senders, (-min(rate, cluster.egress_gbps[exit_node]), counter, exit_node))
        counter += 1  # Line 10; ties go to the earliest pushed sender (Line 11)
    return Chains({k: tuple(v) for k, v in children.items() if v}, pruned)


def plan_chain(num_nodes: int, num_blocks: int, num_sources: int, cluster: Cluster) -> Plan:
    """Plan BlitzScale chains; every chain forwards blocks in layer order."""
    check_sizes(num_nodes, num_blocks, num_sources)
    chains = build_chains(num_nodes, num_sources, cluster)
    return plan_forest(STRATEGY, num_nodes, num_blocks, num_sources, chains.children)
