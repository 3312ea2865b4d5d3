"""Typed timeline events and the in-process publish/subscribe bus that carries them.

What flows: the bodies say what happened — blocks landing per node and tier, instances up
and drained, execution pipelines (nodes and layer ranges) opening and retiring, mode
switches, consolidations and refactorings, live-scaled batches, P/D roles, handoffs and
mutations, per-deployment load — as frozen dataclasses published on an `EventBus`. The
dashboard (`api/dashboard.py`) subscribes and streams them to the browser as server-sent
events; `surge simulate --timeline` and the benchmarks write the same JSON (`Timeline`), so
a replay of either looks alike. Every event's `t_s` is seconds since the bus (the
controller, the simulation) started.

Zero cost when nobody listens: `publish` returns at once without a subscriber, and the one
per-request publisher (`control/requests.py`) checks `bus.active` before it builds an event.
A slow subscriber never slows the publisher: its queue is bounded and overflowing events are
dropped (and counted) for it alone.

This module imports nothing of surge but `errors.py` and `json_codec.py` (events are
named, registered and decoded field by field as the agent protocol's are:
`json_codec.Named`), so `control/`, `runtime/` and `sim/` all publish the same types (the
import rules forbid `runtime/` and `sim/` to import `control/`). Producers: FlexPipe
(`Refactor`), BlitzScale P/D (`PdRole`, `Handoff`, `Mutation`) publish the types defined here.
"""

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from surge.errors import SurgeError
from surge.json_codec import Named, Registry

EVENT_TYPES = Registry("type", "timeline event")
"""Event type name -> class; filled by each class definition."""

TIMELINE_FORMAT = "surge-timeline/1"
"""The `format` field of a timeline file (`Timeline.write`)."""


@dataclass(frozen=True, kw_only=True)
class TimelineEvent(Named):
    """Something that happened, `t_s` seconds after the bus started. Subclasses name
    themselves, `class X(TimelineEvent, name=...)`, as the agent's events do;
    `TimelineEvent.decode(d)` gives the typed event of one JSON object, each field checked
    against its type (a SurgeError names what is wrong)."""

    REGISTRY: ClassVar[Registry] = EVENT_TYPES
    t_s: float = 0.0


# ---- the cluster and its deployments ---------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NodesKnown(TimelineEvent, name="nodes"):
    """The cluster's nodes (one row each on the page)."""

    nodes: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class DeploymentUp(TimelineEvent, name="deployment"):
    """A deployment exists: its strategy (a `policy.systems` name) and its model's shape."""

    model: str
    strategy: str
    num_blocks: int
    num_layers: int
    block_layers: tuple[tuple[int, int], ...] = ()
    """[first_layer, end_layer) of each block."""


@dataclass(frozen=True, kw_only=True)
class DeploymentGone(TimelineEvent, name="deployment_gone"):
    model: str


@dataclass(frozen=True, kw_only=True)
class BlockLanded(TimelineEvent, name="block"):
    """A verified block is usable in a node's tier (gpu, host or disk)."""

    model: str
    node: int
    block: int
    tier: str


# ---- scale-outs, instances, pipelines ----------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ScaleOutStarted(TimelineEvent, name="scale_out"):
    """Placement chose `nodes` for new instances of `model`."""

    model: str
    nodes: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class ScaleOutDone(TimelineEvent, name="scale_out_done"):
    """A scale-out ended: its start kind (hot, warm, cold; "failed")."""

    model: str
    nodes: tuple[int, ...]
    kind: str
    load_s: float
    sources: tuple[int, ...] = ()
    """The multicast's sources, when one ran (its plan nodes 0..K-1)."""


@dataclass(frozen=True, kw_only=True)
class InstanceUp(TimelineEvent, name="instance"):
    """A local instance of `model` serves on `node`."""

    model: str
    node: int
    name: str


@dataclass(frozen=True, kw_only=True)
class InstanceDrained(TimelineEvent, name="instance_drained"):
    """The instance on `node` was released (its GPU copy goes)."""

    model: str
    node: int


@dataclass(frozen=True, kw_only=True)
class PipelineOpened(TimelineEvent, name="pipeline"):
    """An execution pipeline serves: `stages` are (node, first_layer, end_layer)."""

    model: str
    name: str
    stages: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, kw_only=True)
class PipelineRetired(TimelineEvent, name="pipeline_retired"):
    """A pipeline retired (a mode switch): `num_moved` requests moved on."""

    model: str
    name: str
    num_moved: int = 0


@dataclass(frozen=True, kw_only=True)
class ModeSwitch(TimelineEvent, name="mode"):
    """A node's serving mode changed while loading: `live` (joins BlitzScale live
    scaling), `local` (holds every block: serves alone)."""

    model: str
    node: int
    mode: str


@dataclass(frozen=True, kw_only=True)
class Consolidation(TimelineEvent, name="consolidation"):
    """A pipeline group consolidated onto `targets` (ParaServe §6.1), KV moved."""

    model: str
    name: str
    targets: tuple[int, ...]
    num_migrated: int = 0


@dataclass(frozen=True, kw_only=True)
class Refactor(TimelineEvent, name="refactor"):
    """A pipeline's stages changed in place (FlexPipe refactoring)."""

    model: str
    name: str
    stages: tuple[tuple[int, int, int], ...]
    """The new (node, first_layer, end_layer) of each stage."""


@dataclass(frozen=True, kw_only=True)
class LiveBatch(TimelineEvent, name="live_batch"):
    """BlitzScale live scaling: layers [0, split_layer) of a batch ran on `new_node`, the
    rest on `old_node`."""

    model: str
    new_node: int
    old_node: int
    split_layer: int
    num_requests: int
    schedule: str = "best_effort"
    """Which §5.2 schedule gave the split: "zigzag" (the Eq. 1 ILP) or "best_effort"."""
    load_ratio: float = 1.0
    """Eq. 1's Time_l the schedule was made with."""
    load_ratio_measured: bool = False
    """True: Time_l was measured on this run; False: the system's fallback."""
    took_s: float = 0.0
    """Serving-clock seconds from the batch's start (its requests taken) to this event (its
    first tokens sampled and its requests handed on; emulated seconds under emulation)."""


@dataclass(frozen=True, kw_only=True)
class PdRole(TimelineEvent, name="pd_role"):
    """A node serves `role` (prefill, decode or both) for `model`."""

    model: str
    node: int
    role: str


@dataclass(frozen=True, kw_only=True)
class Handoff(TimelineEvent, name="handoff"):
    """KV caches of `num_requests` moved from a prefill to a decode instance."""

    model: str
    from_node: int
    to_node: int
    num_requests: int = 1


@dataclass(frozen=True, kw_only=True)
class Mutation(TimelineEvent, name="mutation"):
    """An instance changed role (BlitzScale P/D: a prefill instance becomes a decode one)."""

    model: str
    node: int
    from_role: str
    to_role: str


# ---- load --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RequestDone(TimelineEvent, name="request"):
    """One request finished: its TTFT and mean inter-token latency (None: no token)."""

    model: str
    ttft_s: float | None
    itl_s: float | None
    num_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Load(TimelineEvent, name="load"):
    """A deployment's load at one autoscaler tick."""

    model: str
    queued: int
    ongoing: int
    instances: int
    loading: int
    pipelines: int


# ---- the bus -----------------------------------------------------------------------------

MAX_QUEUE = 4096
"""Events a subscriber may fall behind by before the newest are dropped for it."""


class Subscription:
    """One subscriber's bounded queue (an asyncio.Queue; `num_dropped` counts overflow)."""

    def __init__(self, max_queue: int) -> None:
        self.queue: asyncio.Queue[TimelineEvent] = asyncio.Queue(max_queue)
        self.num_dropped = 0

    def put(self, ev: TimelineEvent) -> None:
        try:
            self.queue.put_nowait(ev)
        except asyncio.QueueFull:
            self.num_dropped += 1


class EventBus:
    """In-process publish/subscribe of `TimelineEvent`s (one per controller)."""

    def __init__(self, max_queue: int = MAX_QUEUE) -> None:
        self.t0 = time.monotonic()
        self.max_queue = max_queue
        self._subs: list[Subscription] = []

    @property
    def active(self) -> bool:
        """Someone listens (a publisher on a hot path checks this before building an event)."""
        return bool(self._subs)

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def publish(self, ev: TimelineEvent) -> None:
        """Hand `ev` to every subscriber; its `t_s` is stamped now unless it has one."""
        if not self._subs:
            return
        if ev.t_s == 0.0:
            object.__setattr__(ev, "t_s", round(self.now_s(), 6))
        for sub in self._subs:
            sub.put(ev)

    def subscribe(self) -> Subscription:
        sub = Subscription(self.max_queue)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)


NO_BUS = EventBus()
"""A bus nobody subscribes to (the default of producers that were given none)."""


# ---- timelines on disk -------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """A recorded run: its source (serve, simulate, a benchmark) and its events in order."""

    source: str
    events: tuple[TimelineEvent, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TIMELINE_FORMAT,
            "source": self.source,
            "events": [e.to_json() for e in self.events],
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), separators=(",", ":")))

    @staticmethod
    def from_json(d: Any) -> "Timeline":
        if not isinstance(d, dict) or d.get("format") != TIMELINE_FORMAT:
            raise SurgeError(f"not a surge timeline (its format must be {TIMELINE_FORMAT!r})")
        evs = d.get("events")
        if not isinstance(evs, list):
            raise SurgeError("a timeline's 'events' must be a list")
        return Timeline(str(d.get("source", "")), tuple(TimelineEvent.decode(e) for e in evs))

    @staticmethod
    def read(path: Path) -> "Timeline":
        """The timeline in `path`; a SurgeError says why it cannot be read."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise SurgeError(f"timeline file {path} does not exist") from None
        except (OSError, ValueError) as e:
            raise SurgeError(f"timeline file {path} is not JSON: {e}") from None
        except RecursionError:  # json's parser recurses per level: '[' * 100000 was a traceback
            raise SurgeError(
                f"timeline file {path} is nested too deeply to be a timeline"
            ) from None
        return Timeline.from_json(data)


class Recorder:
    """Collects events in memory, for a timeline file (`surge simulate --timeline`, the
    benchmarks): a subscriber without a queue."""

    def __init__(self) -> None:
        self.events: list[TimelineEvent] = []

    def publish(self, ev: TimelineEvent) -> None:
        self.events.append(ev)

    def timeline(self, source: str) -> Timeline:
        return Timeline(source, tuple(self.events))
