"""Placement: which GPUs host new instances.

In: a view of every machine (`MachineView`: free GPUs, whether its host memory holds
the model, how many transfers its NIC carries) and a `PlacementRequest` (GPUs per
instance, how many instances, whether to prefer locality). Out: a tuple of GPU-id
tuples, one per placed instance (fewer than asked when the cluster is full).

Each instance takes GPUs of one machine (tensor parallelism needs the fast intra-node
links, λScale §4.3, BlitzScale Alg. 1 line 1). Machines are ranked by:
1. a host copy of the model first, when `prefer_host_copy` (λScale §5 locality-driven
   startup, ServerlessLLM's locality-aware placement);
2. fewest transfers on the NIC, counting instances placed by this very call, so new
   instances spread over NICs instead of sharing one (ParaServe §4.2, Alg. 2,
   network-contention-aware placement);
3. lowest machine index.
Within a machine the lowest free GPU ids are taken. Pure and deterministic.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from surge.errors import SurgeError


@dataclass(frozen=True)
class MachineView:
    """One machine as the placer sees it."""

    machine: int
    """Machine index."""
    free_gpus: tuple[int, ...]
    """Global ids of its unallocated GPUs, ascending."""
    has_host_copy: bool
    """Its host memory holds the model being placed."""
    nic_load: int
    """Transfers its NIC carries now."""


@dataclass(frozen=True)
class PlacementRequest:
    """What to place. Validated at construction."""

    gpus_per_instance: int
    """GPUs of one instance, all on one machine (>= 1)."""
    num_instances: int
    """Instances wanted (>= 0)."""
    prefer_host_copy: bool = True
    """Rank machines holding the model in host memory first."""

    def __post_init__(self) -> None:
        if self.gpus_per_instance < 1 or self.num_instances < 0:
            raise SurgeError("placement needs >= 1 GPU per instance and >= 0 instances")


def place(
    machines: Sequence[MachineView], request: PlacementRequest
) -> tuple[tuple[int, ...], ...]:
    """GPU ids of each placed instance (see module docstring)."""
    free = {m.machine: list(m.free_gpus) for m in machines}
    load = {m.machine: m.nic_load for m in machines}
    host = {m.machine: m.has_host_copy for m in machines}
    g = request.gpus_per_instance
    placed: list[tuple[int, ...]] = []
    for _ in range(request.num_instances):
        fits = [m for m in free if len(free[m]) >= g]
        if not fits:
            break
        best = min(
            fits,
            key=lambda m: (
                not (request.prefer_host_copy and host[m]),
                load[m],
                m,
            ),
        )
        placed.append(tuple(free[best][:g]))
        del free[best][:g]
        load[best] += 1
    return tuple(placed)
