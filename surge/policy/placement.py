"""Placement: which GPUs host new instances.

In: a view of every machine (`MachineView`: free GPUs, whether its host memory holds
the model, how many transfers its NIC carries) and a `PlacementRequest` (GPUs per
instance, how many instances, whether to prefer locality). Out: a tuple of GPU-id
tuples, one per placed instance (fewer than asked when the cluster is full).

Each instance takes GPUs of one machine (tensor parallelism needs the fast intra-node
links, λScale §4.3, BlitzScale Alg. 1 line 1). Machines are ranked by:
1. a host copy of the model first, when `prefer_host_copy` (λScale §5 locality-driven
   startup, ServerlessLLM's locality-aware placement): `prefers_host_copy(system)` says
   whether a system's loads gain from it, for both bodies;
2. fewest transfers on the NIC, counting instances placed by this very call, so new
   instances spread over NICs instead of sharing one (ParaServe §4.2, Alg. 2,
   network-contention-aware placement);
3. lowest machine index.
Within a machine the lowest free GPU ids are taken.

How many GPUs an instance takes is `tp_size`: the fewest GPUs of one machine (a power of
two) that hold the weights with headroom and leave room for KV cache; `model_home` is the
node group a model runs on and its tensor-parallel size there. The simulator asks both
for every model and worker it places; `surge serve` runs one whole device per instance.
Pure and deterministic.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.systems import SystemConfig

HOST_COPY_LOADS = ("local", "multicast")
"""Loads that read one whole copy into each new instance, so a host copy on its machine
is the fastest source (a warm start). `registry-parallel` groups fetch parts from the
registry over several machines (ParaServe §4); `allcache` and `ideal` load at the same
speed everywhere."""


def prefers_host_copy(system: SystemConfig) -> bool:
    """Whether placing `system`'s new instances ranks machines with a host copy first."""
    return system.load in HOST_COPY_LOADS


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


WEIGHT_HEADROOM = 1.1
"""Weights plus activations take this much of their size in GPU memory."""
MIN_KV_FRACTION = 0.1
"""An instance needs at least this fraction of its GPU memory left for KV cache."""
KV_MEMORY_FRACTION = 0.9
"""Fraction of a GPU's memory weights and KV cache may take (the simulator's default
`SimSettings.kv_memory_fraction`; `surge serve`'s load monitor under GPU-time emulation)."""


def kv_capacity_tokens(memory_bytes: float, weight_bytes: int, kv_bytes_per_token: int) -> int:
    """KV tokens an instance with `memory_bytes` of GPU memory holds beside `weight_bytes`
    of weights (and their activation headroom; at least `MIN_KV_FRACTION` of the memory).
    The simulator's instances hold this many (`sim/instance_factory.py`); `surge serve`'s
    load monitor divides by it under GPU-time emulation (`control/emulation.monitor_kv_tokens`)
    so both bodies see the same KV use (BlitzScale §5.3)."""
    kv_bytes = max(memory_bytes - weight_bytes * WEIGHT_HEADROOM, memory_bytes * MIN_KV_FRACTION)
    return int(kv_bytes // kv_bytes_per_token)


@dataclass(frozen=True)
class GpuGroup:
    """The GPUs of one node group, as this policy sees them."""

    memory_bytes: int
    """Memory of one GPU."""
    gpus_per_node: int
    """GPUs of one machine."""


def tp_size(group: GpuGroup, nbytes: int, kv_memory_fraction: float) -> int | None:
    """Fewest GPUs (a power of two, on one machine of `group`) whose memory holds
    `nbytes` of weights with headroom and still leaves `MIN_KV_FRACTION` for KV cache;
    None if a whole machine cannot."""
    usable = group.memory_bytes * kv_memory_fraction
    tp = 1
    while tp <= group.gpus_per_node:
        if nbytes * WEIGHT_HEADROOM / tp <= usable * (1 - MIN_KV_FRACTION):
            return tp
        tp *= 2
    return None


def model_home(
    groups: Sequence[GpuGroup], model_bytes: int, system: SystemConfig, kv_memory_fraction: float
) -> tuple[int, int] | None:
    """(group index, tensor-parallel size) a model runs on, None when no machine holds
    it: the first group where the fewest GPUs hold the whole model (one full worker), as
    for every system; a `registry-parallel` system whose model no machine holds whole
    takes the group where the fewest GPUs hold one stage (1/pipeline_size of it).
    ParaServe §8.1 runs each model on the card that holds it (Table 1: 7B on A10, 13B on
    V100). The size is the one that holds the whole model there, else the stage's."""
    best: tuple[int, int] | None = None
    stage_options = [1]
    if system.load == "registry-parallel" and system.pipeline_size > 1:
        stage_options.append(system.pipeline_size)
    for stages in stage_options:
        for i, group in enumerate(groups):
            tp = tp_size(group, model_bytes // stages, kv_memory_fraction)
            if tp is not None and (best is None or tp < best[0]):
                best = (tp, i)
        if best is not None:
            break
    if best is None:
        return None
    whole = tp_size(groups[best[1]], model_bytes, kv_memory_fraction)
    return best[1], whole or best[0]
