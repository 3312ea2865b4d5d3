"""The cluster as the planner sees it: per-node link speeds, NVLink groups, busy egress.

In: bandwidths in Gbit/s per node, optional NVLink groups and the nodes whose egress
already carries serving traffic (BlitzScale §5.1).
Out: a validated, immutable `Cluster` that the chain strategy and the timing model read.
"""

import functools
from dataclasses import dataclass, field

from surge.errors import SurgeError


@dataclass(frozen=True)
class Cluster:
    """Links of N nodes. Validated once at construction; raise `SurgeError` if malformed."""

    egress_gbps: tuple[float, ...]
    """Per node, how fast it can send over the network (Gbit/s, > 0)."""
    ingress_gbps: tuple[float, ...]
    """Per node, how fast it can receive over the network (Gbit/s, > 0)."""
    nvlink_groups: tuple[tuple[int, ...], ...] = ()
    """Disjoint sets of >= 2 nodes joined by NVLink (GPUs of one machine)."""
    nvlink_gbps: float = 1600.0
    """Bandwidth of a transfer between two nodes of one NVLink group (Gbit/s, > 0)."""
    busy_egress: frozenset[int] = field(default_factory=frozenset)
    """Nodes whose egress carries serving traffic (e.g. prefill -> decode KV cache)."""

    def __post_init__(self) -> None:
        n = len(self.egress_gbps)
        if len(self.ingress_gbps) != n:
            raise SurgeError(
                f"cluster has {n} egress but {len(self.ingress_gbps)} ingress bandwidths; "
                "give one of each per node"
            )
        for name, values in (("egress", self.egress_gbps), ("ingress", self.ingress_gbps)):
            bad = [v for v in values if not v > 0]
            if bad:
                raise SurgeError(f"{name} bandwidths must be > 0 Gbit/s (got {bad[0]})")
        if not self.nvlink_gbps > 0:
            raise SurgeError(f"nvlink_gbps must be > 0 (got {self.nvlink_gbps})")
        seen: set[int] = set()
        for group in self.nvlink_groups:
            if len(group) < 2 or len(set(group)) != len(group):
                raise SurgeError(f"NVLink group {group} needs >= 2 distinct nodes")
            if seen & set(group) or any(not 0 <= g < n for g in group):
                raise SurgeError(f"NVLink groups must be disjoint nodes 0..{n - 1}: {group}")
            seen |= set(group)
        if any(not 0 <= b < n for b in self.busy_egress):
            raise SurgeError(f"busy_egress names nodes outside 0..{n - 1}")

    @classmethod
    def uniform(cls, num_nodes: int, gbps: float) -> "Cluster":
        """Every node sends and receives at `gbps`."""
        return cls((gbps,) * num_nodes, (gbps,) * num_nodes)

    @classmethod
    def symmetric(cls, gbps: list[float] | tuple[float, ...]) -> "Cluster":
        """Node i sends and receives at gbps[i]."""
        return cls(tuple(gbps), tuple(gbps))

    @property
    def num_nodes(self) -> int:
        """N, the number of nodes described."""
        return len(self.egress_gbps)

    @functools.cached_property
    def _group_of(self) -> dict[int, tuple[int, ...]]:
        """node -> its NVLink group, built once (lookups are per transfer)."""
        return {node: group for group in self.nvlink_groups for node in group}

    def nvlink_group_of(self, node: int) -> tuple[int, ...] | None:
        """The NVLink group holding `node`, if any."""
        return self._group_of.get(node)

    def link_gbps(self, src: int, dst: int) -> float:
        """Bandwidth of one transfer src -> dst: NVLink inside a group, else the slower NIC."""
        group = self.nvlink_group_of(src)
        if group is not None and dst in group:
            return self.nvlink_gbps
        return min(self.egress_gbps[src], self.ingress_gbps[dst])
