"""The multicast's nodes as the planner sees them: the body's facts in, a `Cluster` out.

In (facts the body reports, plan node order, sources first): each node's `NodeLinks` (its
NIC caps as configured, None when uncapped; the host it shares with other nodes and the
fast link between them) and its `NodeTraffic` (P/D prefill instances on it and K/V
hand-offs leaving it). Out: `multicast_cluster` -> the `Cluster` BlitzScale's chain
planner (`multicast/chain.py`, Alg. 1) and the other strategies read: per-node link
speeds, host groups as NVLink groups (BlitzScale §5.1: GPUs of one machine are fed by one
network transfer and a local broadcast), and `busy_sources`, the sources whose egress
carries serving traffic. `surge serve` (`runtime/scaleout/multicast.py`) and tests call
it; it decides, the runtime only reports.

Busy egress (BlitzScale §5.1, Alg. 1 Line 2): "our prune is based on whether a source has
outcast link". Under P/D a prefill instance sends each finished prefill's K/V to a decode
instance — a static flow — so a source holding a prefill instance is pruned, as is any
source with a hand-off leaving it now. Decode and colocated instances only send tokens
(negligible), so they stay. When every source is busy, the one with the least outgoing
traffic is kept: a slower scale-out beats none (the paper assumes a free source exists).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.multicast.cluster import Cluster

UNCAPPED_GBPS = 100.0
"""Speed an uncapped link is planned at (Gbit/s): the planner's uniform default
(`policy.multicast.scale_out.DEFAULT_GBPS`), a datacenter NIC."""
HOST_LINK_GBPS = 1600.0
"""Speed of the fast link between nodes of one host when none is configured (Gbit/s):
NVLink, as `Cluster.nvlink_gbps` (BlitzScale §5.1: 105 ms to broadcast a 7B model)."""


@dataclass(frozen=True)
class NodeLinks:
    """One node's links as its agent reports them (configured caps, not measurements)."""

    egress_gbps: float | None = None
    """Its NIC's send cap (None: uncapped, planned at `UNCAPPED_GBPS`)."""
    ingress_gbps: float | None = None
    """Its NIC's receive cap (None: uncapped)."""
    host: str | None = None
    """Nodes naming the same host share a machine and a fast link; None: a machine alone."""
    host_gbps: float | None = None
    """The fast link between nodes of its host (None: `HOST_LINK_GBPS`)."""
    shares_device: bool = False
    """Its device's memory can be opened by the other nodes of its host (CUDA IPC, the fake
    GPU; not the CPU): a mate's device copy is shared, not copied (`policy.copies.mate_copies`)."""

    def __post_init__(self) -> None:
        for name in ("egress_gbps", "ingress_gbps", "host_gbps"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise SurgeError(f"{name} must be > 0 Gbit/s or unset (got {v})")


@dataclass(frozen=True)
class NodeTraffic:
    """What a node's egress carries now besides the multicast."""

    prefill_instances: int = 0
    """P/D prefill instances on the node (each sends K/V to decode instances)."""
    handoffs_out: int = 0
    """K/V hand-offs waiting to leave the node or leaving it now."""

    @property
    def outgoing(self) -> int:
        return self.prefill_instances + self.handoffs_out


def busy_sources(num_sources: int, traffic: Sequence[NodeTraffic]) -> frozenset[int]:
    """Sources (plan nodes 0..K-1) whose egress is busy with serving traffic; never all
    of them (the least busy, then the lowest, stays)."""
    busy = [s for s in range(num_sources) if traffic[s].outgoing > 0]
    if len(busy) == num_sources:
        keep = min(range(num_sources), key=lambda s: (traffic[s].outgoing, s))
        busy.remove(keep)
    return frozenset(busy)


def server_of_nodes(links: Mapping[int, NodeLinks]) -> dict[int, int]:
    """Each node's server: the lowest node of its host group, itself when alone (FlexPipe
    §7's HRG places a pipeline's stages on the fewest servers, `policy.flexpipe.hrg`)."""
    first: dict[str, int] = {}
    for node in sorted(links):
        host = links[node].host
        if host is not None:
            first.setdefault(host, node)
    return {n: first[x.host] if x.host is not None else n for n, x in links.items()}


def _groups(links: Sequence[NodeLinks]) -> tuple[tuple[int, ...], ...]:
    by_host: dict[str, list[int]] = {}
    for node, link in enumerate(links):
        if link.host is not None:
            by_host.setdefault(link.host, []).append(node)
    return tuple(tuple(nodes) for nodes in by_host.values() if len(nodes) > 1)


def multicast_cluster(
    num_sources: int, links: Sequence[NodeLinks], traffic: Sequence[NodeTraffic] = ()
) -> Cluster:
    """The `Cluster` of one multicast's nodes (plan order: sources 0..K-1 first).

    `traffic` may be empty (nothing busy) or give one entry per node."""
    n = len(links)
    if not 1 <= num_sources < n:
        raise SurgeError(f"a multicast needs 1 <= sources < nodes (got {num_sources} of {n})")
    if traffic and len(traffic) != n:
        raise SurgeError(f"traffic describes {len(traffic)} nodes, links {n}")
    groups = _groups(links)
    fast = [links[g].host_gbps or HOST_LINK_GBPS for group in groups for g in group]
    return Cluster(
        egress_gbps=tuple(x.egress_gbps or UNCAPPED_GBPS for x in links),
        ingress_gbps=tuple(x.ingress_gbps or UNCAPPED_GBPS for x in links),
        nvlink_groups=groups,
        # One rate for every group (the Cluster's model): the slowest configured one.
        nvlink_gbps=min(fast) if fast else HOST_LINK_GBPS,
        busy_egress=busy_sources(num_sources, traffic) if traffic else frozenset(),
    )
