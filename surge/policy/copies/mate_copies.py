"""One device copy per host group: which new instances open a host mate's device copy
instead of loading their own (the NVLink analogue; BlitzScale §5.1's NVLink groups,
ServerlessLLM's and Dynamo's one copy per host).

In: a scale-out's destinations (node ids, placement order), each node's reported links
(`policy.multicast.topology.NodeLinks`: its host group, and whether its device's memory can
be opened by its host mates, `shares_device`: CUDA IPC or the fake GPU, never the CPU), and
the nodes that hold a complete device copy of the model of their own (not one they mapped
from a mate: a mapping cannot be handed on, CUDA IPC exports only a process's own
allocations). Out: one `MateOpen` per destination that opens a mate's copy; the other
destinations start up as `policy.startup` plans. `surge serve`'s scale-out carries them out
(`runtime/scaleout/run.py`: `open_mate_copy`, then the instance serves); the simulator
models no device sharing (docs/gpu.md).

Rules:
- A destination shares only within its own host group, and only when both its device and
  the owner's can share: IPC handles mean nothing on another machine or on the CPU.
- Of several owners in the group, the lowest node id (opening costs no link time, so there
  is nothing to balance; one owner keeps the copies a node's death takes along few).
- Destinations of one scale-out in a group with no device copy yet load as planned (none
  waits for another's load to finish).
Pure and deterministic.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from surge.policy.multicast.topology import NodeLinks


@dataclass(frozen=True)
class MateOpen:
    """A destination that maps its host mate's device copy instead of loading one."""

    node: int
    """The destination."""
    mate: int
    """The host mate whose device copy it opens (its own copy, never a mapped one)."""


def plan_mate_opens(
    destinations: Sequence[int],
    links: Mapping[int, NodeLinks],
    device_owners: Sequence[int],
) -> tuple[MateOpen, ...]:
    """The destinations that open a host mate's device copy (see module docstring), in
    destination order. A node missing from `links` is alone and shares nothing."""
    owner_of_group: dict[str, int] = {}
    for node in sorted(device_owners):
        own = links.get(node)
        if own is not None and own.host is not None and own.shares_device:
            owner_of_group.setdefault(own.host, node)
    opens: list[MateOpen] = []
    for node in destinations:
        own = links.get(node)
        if own is None or own.host is None or not own.shares_device:
            continue
        mate = owner_of_group.get(own.host)
        if mate is not None and mate != node:
            opens.append(MateOpen(node, mate))
    return tuple(opens)
