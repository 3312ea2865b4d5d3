"""Endpoints built: what one instance (or execution pipeline) of a pool is, and how big.

In: a pool and the `Placement` the scaler, a ParaServe group or a consolidation chose (its
GPUs, shares and workers). Out: an `Instance` with every field declared in
`Instance.__init__` — its cost model on those GPUs, its KV capacity beside the weights
(`kv_capacity_tokens`), its batch limit and, for an execution pipeline, its micro-batches
(λScale §4.3) — told to the host model. `tp_for` sizes an instance's tensor parallelism
on one of this run's node groups (`policy.placement.tp_size`; `gpu_group` is a node group
as `policy.placement` sees it). `sim/simulator.py` makes the one factory of a run and hands
its `make` to the scaler and to the loaders (`sim/loading.py`, `sim/multicast_load.py`,
`sim/groups.py`, `sim/consolidation.py`).
"""

from surge.policy.flexpipe.microbatch import pipeline_micro_batches
from surge.policy.paraserve.gpu_share import pipeline_speed
from surge.policy.placement import GpuGroup, tp_size
from surge.policy.placement import kv_capacity_tokens as placement_kv_tokens
from surge.sim.costs import cost_model
from surge.sim.engine_spec import EngineSpec
from surge.sim.hardware import NodeGroup
from surge.sim.host import HostModel
from surge.sim.instance import Instance
from surge.sim.models import ModelProfile
from surge.sim.placement import Placement
from surge.sim.pools import Pool, Requests
from surge.sim.world import KEY_STRIDE, World


class InstanceFactory:
    """Builds endpoints: cost model, KV capacity and limits from the model and GPUs."""

    def __init__(
        self,
        world: World,
        requests: Requests,
        host: HostModel,
    ) -> None:
        self.world = world
        self.requests = requests
        self.host = host
        """Told of every endpoint made (`HostModel.attach`)."""
        self.next_id = 0

    def make(self, pool: Pool, placement: Placement, pipeline: bool = False) -> Instance:
        """A new endpoint of `pool` on `placement`; its workers run in stage order (one
        activation hop per stage boundary). `pipeline`: an execution pipeline, with
        `SimSettings.pipeline_micro_batches` micro-batches in flight (None: one per stage)
        and that many times the batch limit."""
        world, settings = self.world, self.world.settings
        slot = world.models[pool.model]
        tp = len(placement.gpus)
        # a worker holding a share of its GPU holds that share of its memory (ParaServe
        # §4.1.1) and computes at that quota: the group's speed, `pipeline_speed`
        mem = slot.group.gpu.memory_bytes * settings.kv_memory_fraction * placement.gpu_count
        speed = settings.pipeline_speed if pipeline else 1.0
        if placement.shares:
            speed *= pipeline_speed(placement.shares)
        # λScale §4.3 Fig. 6a: each stage of a pipeline works on a different batch (None);
        # an int is this runtime's fixed count of micro-batch groups (`SimSettings`)
        staged = pipeline and settings.pipeline_micro_batches is None
        micro = 1
        if pipeline:
            micro = settings.pipeline_micro_batches or pipeline_micro_batches(
                len(placement.workers)
            )
        self.next_id += 1
        spec = EngineSpec(
            cost_model(slot.profile, slot.group.gpu, tp),
            pool.role,
            settings.max_batch * micro,
            kv_capacity_tokens(mem, slot.profile),
            settings.max_prefill_tokens,
            speed=speed,
            hop_s=(len(placement.workers) - 1) * world.system.stage_hop_s,
        )
        inst = Instance(
            KEY_STRIDE + self.next_id,
            world.loop,
            spec,
            self.requests.on_done,
            self.requests.on_prefilled,
            placement=placement,
            pool_key=pool.key,
        )
        if staged:
            inst.set_micro_batches(micro, len(placement.workers))
        self.host.attach(inst)
        return inst


def gpu_group(group: NodeGroup) -> GpuGroup:
    """A node group as `policy.placement` sees it."""
    return GpuGroup(group.gpu.memory_bytes, group.gpus_per_node)


def kv_capacity_tokens(mem_bytes: float, profile: ModelProfile) -> int:
    """KV tokens an instance with `mem_bytes` of GPU memory holds beside `profile`'s
    weights (`policy.placement.kv_capacity_tokens`)."""
    return placement_kv_tokens(mem_bytes, profile.total_bytes, profile.kv_bytes_per_token)


def tp_for(group: NodeGroup, nbytes: int, kv_memory_fraction: float) -> int | None:
    """`policy.placement.tp_size` on one of this run's node groups."""
    return tp_size(gpu_group(group), nbytes, kv_memory_fraction)
