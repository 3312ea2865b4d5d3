"""The controller's records: one `Deployment` per served model, one `Instance` per slot it holds,
and the `TrackedRequest` the HTTP API streams from.

Mutable records shared by the collaborators of `control/controller.py` (deployments,
requests, autoscaler, copies): each field says who writes it. Times are the control
plane's clock's (`runtime/clock.py`: emulated seconds under GPU-time emulation). Owned by control/.
"""

import asyncio
import logging
import math
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from surge.control.spec import DeploymentSpec
from surge.errors import Unavailable
from surge.model.manifest import Manifest
from surge.policy.autoscale import AutoscaleState
from surge.policy.blitzscale.monitor import StepProfile
from surge.policy.flexpipe.granularity import GranularityState
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.request import ServeRequest
from surge.runtime.server import Server

log = logging.getLogger(__name__)


@dataclass
class FlexPipeRecord:
    """What the granularity loop remembers about one deployment."""

    state: GranularityState = field(default_factory=GranularityState)
    """The Eq. 4 controller's state (smoothed CV, granularity in use)."""
    last_decision_s: float = -math.inf
    cv: float = 0.0
    """The last CV sample (inter-arrival times of the window)."""
    num_stages: int | None = None
    """The finest stage count chosen last: Eq. 4's for the CV, at most `useful_stages`
    (what busy groups split to while requests wait)."""
    refactors: dict[str, int] = field(default_factory=lambda: {"split": 0, "merge": 0})
    """Refactorings that completed, by direction."""
    failed_refactors: int = 0
    booked: set[int] = field(default_factory=set)
    """Nodes booked for a refactoring under way (not yet in their pipeline)."""


class TrackedRequest(ServeRequest):
    """A `ServeRequest` that also wakes a streamer on every token."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.progress = asyncio.Event()
        """Set on every token and at the end; the API clears it after reading."""
        self.deployment = ""
        """Name of the deployment it was submitted to."""
        self.at_zero = False
        """It arrived while its deployment had no serving endpoint (waited for a scale-out)."""
        self.exception: Unavailable | None = None
        """Why the controller ended it unserved (`refuse`); the API raises it."""

    def add_token(self, token: int, finished: bool, reason: str | None) -> None:
        super().add_token(token, finished, reason)
        self.progress.set()

    def refuse(self, error: Unavailable) -> None:
        """End it unserved with finish_reason "error" (held past its timeout, or its
        deployment failed); `error` is what the API answers (503, `Retry-After`)."""
        if self.done.is_set():
            return
        self.exception = error
        self.error = str(error)
        self.finish("error")

    def finish(self, reason: str) -> None:
        """End it from the controller's side (stop string, deletion, client gone)."""
        if not self.done.is_set():
            self.done_t = self.clock.now_s()
            self.finish_reason = reason
            self.done.set()
            self.progress.set()


def refuse(req: ServeRequest, error: Unavailable) -> None:
    """End a request unserved with `error`: what the API answers for a `TrackedRequest`,
    the reason for any other (one submitted to the server directly)."""
    if isinstance(req, TrackedRequest):
        req.refuse(error)
    else:
        req.fail(str(error))


@dataclass
class Instance:
    """One slot of a deployment on one node, from placement until release."""

    node: int
    """The node whose slot it holds."""
    endpoint: LocalEndpoint | None = None
    """The serving local instance; None while the scale-out still loads it."""
    idle_since_s: float | None = None
    """Since when it has had no outstanding request (None: busy or loading)."""
    num_sending: int = 0
    """Multicasts it is a GPU source of now: busy, never released mid-send (as in the
    simulator)."""
    receiving: bool = False
    """It receives a multicast now: a chain tail a later scale-out may forward from as
    blocks land (`policy.startup` tier `loading`, BlitzScale §5.1 Alg. 1 line 10)."""


@dataclass(frozen=True)
class FailedDeployment:
    """A stored deployment that cannot serve (its store is missing or damaged): listed with
    its reason, deletable, and never retried until it is deleted and deployed again."""

    spec: DeploymentSpec
    reason: str


@dataclass
class Deployment:
    """A served model: its spec and store, its router, its slots and its bookkeeping."""

    spec: DeploymentSpec
    """What the user asked for (stored in SQLite)."""
    manifest: Manifest
    """The model store's manifest (blocks, sizes, architecture)."""
    tokenizer: Any
    """The store's tokenizer (None when the store has none)."""
    server: Server
    """Routes its requests over its endpoints (runtime)."""
    instances: dict[int, Instance] = field(default_factory=dict)
    """Slots by node, loading or serving (written by the autoscaler)."""
    autoscale_state: AutoscaleState = field(default_factory=AutoscaleState)
    """What `surge.policy.autoscale` remembers between ticks (stable and panic windows)."""
    tasks: set[asyncio.Task] = field(default_factory=set)
    """Background work of this deployment (scale-outs, host copies, aborts); cancelled on
    teardown."""
    restoring: bool = False
    """A pinned host copy is being made (the invariant is not checked meanwhile)."""
    creating: bool = False
    """Its creation still waits for its kept host copies (a delete then stops them and the
    creation answers 409)."""
    last_start: str | None = None
    """Start kind of the last scale-out that completed: hot, warm or cold."""
    num_scale_outs: int = 0
    """Scale-outs started."""
    pinned_nodes: set[int] = field(default_factory=set)
    """Nodes whose host copy is pinned, as the system's `host_cache` keeps them
    (`policy.copies.host_copies.kept_copies`: BlitzScale §5.3's one, every node under `all`,
    none under `lru` and `none`)."""
    host_last_used_s: dict[int, float] = field(default_factory=dict)
    """Last use of the host copy on each node (keep-alive and LRU, `copies.py`)."""
    num_kv_migrated: int = 0
    """Requests moved onto new instances with their KV cache (ParaServe consolidation)."""
    num_live_prefilled: int = 0
    """Requests prefilled by live scaling (BlitzScale)."""
    multicasting: bool = False
    """A serve-while-loading scale-out of this deployment is running."""
    host_sending: dict[int, int] = field(default_factory=dict)
    """Node -> multicasts its host copy is a source of now (its NIC is held: later
    start-ups rank it by the egress left, as the simulator's `host_sending`)."""
    failure: str | None = None
    """Why it failed (its store went bad); set once, by `deployments.py` `fail`."""
    flexpipe: FlexPipeRecord | None = None
    """FlexPipe's granularity loop state (`control/flexpipe.py`); None for other strategies."""
    step_profile: StepProfile | None = None
    """Its real engine's measured steps, read or taken when it was deployed (BlitzScale
    §5.3, `control/emulation.deployment_profile`): the load monitor's bounds follow them;
    None (until then, or for good): the host's estimates (or the emulated cost model)."""

    @property
    def requests(self) -> dict[str, ServeRequest]:
        """Requests the API still streams, by id: the server's book, the one place a
        request is kept (`requests.py` adds and forgets them; endpoints hold the ones they
        serve)."""
        return self.server.requests

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pinned_node(self) -> int | None:
        """The lowest node with a pinned host copy (BlitzScale §5.3's one), None if none."""
        return min(self.pinned_nodes, default=None)

    def serving(self) -> list[Instance]:
        """Instances whose local endpoint is open."""
        return [i for i in self.instances.values() if i.endpoint is not None]

    def num_pipelines(self) -> int:
        """Execution pipelines serving now (λScale §4.3)."""
        return sum(isinstance(e, PipelineEndpoint) for e in self.server.endpoints.values())

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run `coro` as this deployment's background task (cancelled on teardown)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # nobody awaits it
            log.warning("%s: background task failed: %s", self.name, task.exception())
