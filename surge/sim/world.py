"""What every part of one simulation run shares: clock, links, cluster, system, models.

In: built once by `simulator.Simulation`. Out: a `World` that pools, scaling, loading,
host caches and groups read (none of them owns it, none of them holds another's state).
"""

from dataclasses import dataclass
from typing import Any

from surge.events import PipelineOpened, Recorder, TimelineEvent
from surge.policy.multicast.pipelines import Pipeline
from surge.policy.systems import SystemConfig
from surge.sim.cluster_state import ClusterState
from surge.sim.events import EventLoop
from surge.sim.flows import FlowNetwork
from surge.sim.hardware import NodeGroup
from surge.sim.models import ModelProfile
from surge.sim.result import SimResult
from surge.sim.settings import SimSettings

KEY_STRIDE = 1_000_000
"""Event keys: requests use their id, instances KEY_STRIDE + id, pools 2*KEY_STRIDE + i."""
HOST_NODE = 3 * KEY_STRIDE
"""Start-up node ids: instances use their id, a host copy on machine m HOST_NODE + m."""


@dataclass(frozen=True)
class ModelSlot:
    """One model of the run and where it runs."""

    name: str
    """Distinct name (`NAME#i` for copies of one profile)."""
    profile: ModelProfile
    """Its size, layers and costs."""
    group: NodeGroup
    """The node group its instances run on."""
    tp: int
    """GPUs of one worker (tensor parallelism) there."""


@dataclass(frozen=True)
class World:
    """Shared references of one run (the objects inside change; the references don't)."""

    loop: EventLoop
    net: FlowNetwork
    state: ClusterState
    system: SystemConfig
    settings: SimSettings
    models: tuple[ModelSlot, ...]
    result: SimResult
    timeline: Recorder | None = None
    """Where `surge simulate --timeline` records the dashboard's events (None: nowhere)."""

    def publish(self, cls: type[TimelineEvent], **fields: Any) -> None:
        """Record a timeline event at the virtual time now (nothing is built without one)."""
        if self.timeline is not None:
            self.timeline.publish(cls(t_s=self.loop.now_s, **fields))

    def publish_pipeline(
        self, model: int, pipeline: Pipeline, machines: list[int], tag: str
    ) -> None:
        """The dashboard's view of an opened pipeline: (machine, first_layer, end_layer)
        of each stage; `machines[i]` runs stage i."""
        if self.timeline is None:
            return
        slot = self.models[model]
        n, b = slot.profile.num_layers, max(s.last_block for s in pipeline.stages) + 1
        stages = tuple(
            (machines[i], s.first_block * n // b, (s.last_block + 1) * n // b)
            for i, s in enumerate(pipeline.stages)
        )
        self.publish(PipelineOpened, model=slot.name, name=f"{slot.name}-{tag}", stages=stages)

    def pool_name(self, model: int, role: str) -> str:
        """How scale events name a pool."""
        name = self.models[model].name
        return name if role == "both" else f"{name}/{role}"

    def event(self, model: int, role: str, kind: str, count: int = 1) -> None:
        """Record a scale event (scale-out, release, mutate, pipeline, consolidate)."""
        self.result.scale_events.append((self.loop.now_s, self.pool_name(model, role), kind, count))
