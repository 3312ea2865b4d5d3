"""The K/V each instance of a P/D deployment was handed over the monitor's window, as time
of the link it arrives through (BlitzScale §5.2's K/V incast, which the monitor weighs).

What flows: each hand-off's bytes, source node and target instance in (`received`, from
`runtime/migration/pd_handoff.py`); out, an instance's `kv_ingress_usage` now (`usage`,
`policy.blitzscale.pd.ingress_usage` of the hand-offs still in the window). The simulator
counts the same (`sim/pd.py` `PdPool.handed`). Owned by the runtime.
"""

from collections import deque
from collections.abc import Mapping

from surge.policy.autoscale import RATE_WINDOW_S
from surge.policy.blitzscale import pd
from surge.policy.multicast.topology import HOST_LINK_GBPS, NodeLinks
from surge.runtime.clock import Clock


class KvIngress:
    """Per instance, (when, link-seconds) of each hand-off to it within the window."""

    def __init__(self, links: Mapping[int, NodeLinks], clock: Clock, kv_pace: float) -> None:
        self.links = links
        """Each node's reported links: the caps a hand-off's K/V arrives through."""
        self.clock = clock
        self.kv_pace = kv_pace
        """How K/V bytes are paced (GPU-time emulation: the K/V's own byte ratio; 1: as
        its bytes)."""
        self._handed: dict[str, deque[tuple[float, float]]] = {}

    def received(self, source_node: int | None, target_node: int, target: str, nbytes: int) -> None:
        """A hand-off's `nbytes` of K/V go to instance `target` on `target_node` from
        `source_node` (None: from the controller): their time alone on the link they
        arrive through (a host mate's fast link, else its NIC; uncapped: none), as the
        simulator counts it (`PdPool.handed`); paced bytes (`kv_pace`: under GPU-time
        emulation the link caps are scaled for weight bytes), in the serving clock's
        seconds (the caps are real: emulated ones D times slower, so a link-second of them
        is 1/D emulated second — counted as real, every hand-off looked D times the incast
        it is and every new baseline instance joined as decode)."""
        into = self.links.get(target_node, NodeLinks())
        src = self.links.get(source_node, NodeLinks()) if source_node is not None else None
        if src is not None and into.host is not None and src.host == into.host:
            gbps: float | None = into.host_gbps or HOST_LINK_GBPS
        else:
            gbps = into.ingress_gbps
        if gbps:
            link_s = self.clock.of_real(nbytes * self.kv_pace * 8 / (gbps * 1e9))
            self._handed.setdefault(target, deque()).append((self.clock.now_s(), link_s))

    def usage(self, target: str, now_s: float) -> float:
        """`target`'s `kv_ingress_usage` at `now_s` (hand-offs older than the window are
        dropped)."""
        handed = self._handed.get(target, deque())
        while handed and handed[0][0] < now_s - RATE_WINDOW_S:
            handed.popleft()
        return pd.ingress_usage(handed, now_s)

    def forget(self, target: str) -> None:
        self._handed.pop(target, None)
