"""The controller's side of one scale-out: what only the controller can do, as one object.

What flows: the runtime's scale-out (`runtime/scaleout/`) calls `DeploymentSide` back
through the `ControllerSide` protocol: book a spare slot for a ParaServe or FlexPipe group
member and give it back, bring the model into a node's host tier (a cold leader) or keep
the one a load passes through (ServerlessLLM's LRU cache), hear that
a node serves as a local instance, count which instances send or receive a multicast, ask
what each egress carries, and read and add FlexPipe's scaling marks (§7's HRG). It acts on
the deployment's records and on the autoscaler's slot ledger (`SlotLedger`, passed in; the
autoscaler is one). Owned by control/.
"""

from collections.abc import Callable, Mapping
from typing import Protocol

from surge.control.copies import Copies
from surge.control.pd import egress_traffic
from surge.control.state import Deployment, Instance
from surge.policy.flexpipe.hrg import ScalingMark
from surge.policy.multicast.topology import NodeTraffic
from surge.runtime.endpoints import LocalEndpoint


class SlotLedger(Protocol):
    """What a scale-out's controller side needs of the autoscaler (slots and NICs)."""

    nic_load: dict[int, int]
    """Scale-outs each node's NIC takes part in now."""
    copies: Copies
    deployments: dict[str, Deployment]
    live_nodes: Callable[[], list[int]]
    scaling_marks: list[ScalingMark]
    """The cluster's recent scaling events (FlexPipe §7's HRG; FlexPipe's loop adds its
    refactorings' too)."""

    def free_slots(self, node: int) -> int: ...

    async def on_local(self, dep: Deployment, node: int, ep: LocalEndpoint) -> None: ...


class DeploymentSide:
    """The `runtime.scaleout.ControllerSide` of one scale-out of `dep`. Slots it books are
    appended to `booked` (the autoscaler frees those that never came up)."""

    def __init__(self, dep: Deployment, ledger: SlotLedger, booked: list[int]) -> None:
        self.dep, self.ledger, self.booked = dep, ledger, booked

    async def on_local(self, node: int, ep: LocalEndpoint) -> None:
        await self.ledger.on_local(self.dep, node, ep)

    async def make_host_copy(self, node: int) -> None:
        await self.ledger.copies.make_host_copy(self.dep, node, pin=True)

    def keep_host_copy(self, node: int) -> bool:
        return self.ledger.copies.copy_through_host(self.dep, node)

    def host_copy_done(self, node: int) -> None:
        self.ledger.copies.copy_landed(self.dep.name, node)

    def book(self, node: int) -> bool:
        dep, ledger = self.dep, self.ledger
        if node in dep.instances or node not in ledger.live_nodes():
            return False
        if ledger.free_slots(node) < 1:
            return False
        dep.instances[node] = Instance(node)
        ledger.nic_load[node] = ledger.nic_load.get(node, 0) + 1
        self.booked.append(node)
        return True

    async def release(self, node: int) -> None:
        dep = self.dep
        inst = dep.instances.get(node)
        if inst is not None and inst.endpoint is None:
            dep.instances.pop(node, None)
            await self.ledger.copies.release_slot(dep.name, node, dep.manifest.num_blocks)

    def sending(self, nodes: tuple[int, ...], delta: int) -> None:
        for n in nodes:
            inst = self.dep.instances.get(n)
            if inst is not None:
                inst.num_sending = max(0, inst.num_sending + delta)

    def host_sending(self, nodes: tuple[int, ...], delta: int) -> None:
        held = self.dep.host_sending
        for n in nodes:
            held[n] = max(0, held.get(n, 0) + delta)

    def receiving(self, nodes: tuple[int, ...], now: bool) -> None:
        for n in nodes:
            inst = self.dep.instances.get(n)
            if inst is not None:
                inst.receiving = now

    def traffic(self) -> Mapping[int, NodeTraffic]:
        return egress_traffic(self.ledger.deployments.values())

    def scaling_marks(self) -> tuple[ScalingMark, ...]:
        return tuple(self.ledger.scaling_marks)

    def mark_scaling(self, marks: tuple[ScalingMark, ...]) -> None:
        record_marks(self.ledger.scaling_marks, marks)


MAX_MARKS = 256
"""Most scaling marks kept (the HRG reads only those in its window, seconds old)."""


def record_marks(kept: list[ScalingMark], marks: tuple[ScalingMark, ...]) -> None:
    """Append `marks` to the cluster's list, keeping the latest `MAX_MARKS`."""
    kept.extend(marks)
    del kept[:-MAX_MARKS]
