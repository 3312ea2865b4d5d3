"""An instance (or execution pipeline): a serving endpoint where it runs, and its lifecycle.

In: what `ServingEngine` takes (`sim/serving_engine.py`: the head engines, one per
micro-batch, that serve its requests, from an `EngineSpec`), its GPUs (`Placement`) and the
(model, role) pool it serves in.
Out: the endpoint the router sends requests to and that scaling, loading, groups and
compute sharing read and set. Placement and lifecycle (which GPUs, which pool,
loaded/serving/released, KV hand-offs and multicasts in flight) are declared here, and
`__slots__` (here and in `ServingEngine`) makes any other attribute an error: the simulator's
modules read and set only these fields.
"""

from collections.abc import Callable

from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop
from surge.sim.placement import NOWHERE, Placement
from surge.sim.request import SimRequest
from surge.sim.serving_engine import ServingEngine


class Instance(ServingEngine):
    """A serving endpoint; a plain instance or an execution pipeline of loading nodes."""

    __slots__ = (
        "loaded",
        "placement",
        "pool_key",
        "released",
        "reserved",
        "route_target",
        "sending",
        "serving",
    )

    def __init__(
        self,
        iid: int,
        loop: EventLoop,
        spec: EngineSpec,
        on_done: Callable[["Instance", SimRequest], None],
        on_prefilled: Callable[["Instance", SimRequest], None],
        placement: Placement = NOWHERE,
        pool_key: tuple[int, str] = (0, "both"),
    ) -> None:
        super().__init__(iid, loop, spec, on_done, on_prefilled)
        self.route_target: float | None = None
        """Requests a `pack` router fills it up to (`policy.router`; FlexPipe groups)."""
        self.placement = placement
        """Its GPUs."""
        self.pool_key = pool_key
        """(model index, role) of the pool it serves in."""
        self.serving = False
        """The router may send it requests (complete, live, or an open pipeline)."""
        self.loaded = False
        """It holds the whole model (not loading any more)."""
        self.released = False
        """Given back (or retired): late callbacks about it are ignored."""
        self.sending = 0
        """Multicasts it is a GPU source of (it stays up until they end)."""
        self.reserved = 0
        """Requests whose KV cache is on its way here (P/D hand-off)."""

    def route_fields(self) -> tuple[int, int, float, float | None, int]:
        """The router's view of it after its id, outside P/D (`policy.router.Endpoint`:
        requests held here and on their way, batch limit, speed, target, micro-batches),
        read off the fields the properties return: every routing decision reads every
        endpoint of its pool (`sim/pools.py`)."""
        return (
            self._held.n + self.reserved,
            self._max_batch,
            self.heads[0].clock.speed,
            self.route_target,
            self.micro_batches,
        )

    @property
    def gpus(self) -> tuple[int, ...]:
        """Its first worker's GPUs."""
        return self.placement.gpus

    @property
    def all_gpus(self) -> tuple[int, ...]:
        """Every GPU it holds."""
        return self.placement.all_gpus

    @property
    def machine(self) -> int:
        """Machine of its first worker."""
        return self.placement.machine
