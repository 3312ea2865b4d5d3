"""Processor sharing of one host's cores (`SimSettings.shared_cores`).

In: endpoints turning busy or idle (`Instance.on_busy`) and multicast block transfers
starting and ending. Out: every busy endpoint's `share` and the flow network's speed:
each consumer gets min(1, cores / demand) of what it needs, demand = busy endpoints (a
pipeline counts once: a 3-stage pipeline with 2 micro-batch streams measured ~1.0 core,
like a local instance) + `transfer_cores` per block transfer in flight (transfers slow
down too: `FlowNetwork.set_speed`). With `shared_cores` None nothing is shared.
"""

from surge.sim.flows import FlowNetwork
from surge.sim.instance import Instance


class ComputeSharing:
    """The busy endpoints and transfers of the shared host."""

    def __init__(self, net: FlowNetwork, shared_cores: float | None, transfer_cores: float) -> None:
        self.net = net
        self.shared_cores = shared_cores
        self.transfer_cores = transfer_cores
        self.busy: dict[int, Instance] = {}
        """Busy endpoints by id."""
        self.transfers = 0
        """Multicast block transfers in flight."""

    @property
    def enabled(self) -> bool:
        """Whether endpoints share cores at all."""
        return self.shared_cores is not None

    def share(self) -> float:
        """The share every consumer of the cores gets now: min(1, cores / demand); 1.0
        when nothing is shared (also what an endpoint opening gets, `sim/carrier.py`)."""
        if self.shared_cores is None:
            return 1.0
        demand = len(self.busy) + self.transfer_cores * self.transfers
        return min(1.0, self.shared_cores / demand) if demand > 0 else 1.0

    def on_busy(self, inst: Instance) -> None:
        """`inst` turned busy or idle."""
        if inst.busy:
            self.busy[inst.id] = inst
        else:
            self.busy.pop(inst.id, None)
        self._reshare()

    def on_transfers(self, delta: int) -> None:
        """`delta` block transfers started (+) or ended (-)."""
        self.transfers += delta
        if self.shared_cores is not None and self.transfer_cores > 0:
            self._reshare()

    def _reshare(self) -> None:
        share = self.share()
        if self.transfer_cores > 0:
            self.net.set_speed(share)
        for iid in sorted(self.busy):
            if self.busy[iid].share != share:
                self.busy[iid].set_share(share)
