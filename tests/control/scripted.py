"""A control plane with no cluster behind it, for tests of one decision or one clock: a
client that answers ops as an agent would (`ScriptedClient`), a host clock the test moves
(`RealTime`), a GPU-time emulation (`emulation`), and an `Autoscaler` with its `Copies` over
an empty deployment table (`bare_autoscaler`). Shared by tests/control, tests/emulation and
tests/parity, which used to build the autoscaler by hand."""

from collections.abc import Iterable
from typing import Any

from surge.config import EngineConfig
from surge.control.autoscaler import Autoscaler
from surge.control.copies import Copies
from surge.control.metrics import Metrics
from surge.control.pool import ParameterPool
from surge.control.settings import ControllerConfig
from surge.emulation import Emulation, EmulationConfig
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.protocol import Ack, Op

D = 10.0
"""The time dilation the emulated-clock tests use."""


class ScriptedClient:
    """Answers ops like an agent would, failing the op classes it is told to."""

    def __init__(self, failing: tuple[type[Op], ...] = ()) -> None:
        self.down: set[int] = set()
        self.failing = failing
        self.sent: list[tuple[int, Op]] = []

    async def call(self, node: int, op: Op) -> Any:
        self.sent.append((node, op))
        if isinstance(op, self.failing):
            raise RuntimeError(f"{op.NAME} failed on node {node}")
        return Ack()


class RealTime:
    """The host's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def emulation(d: float = D) -> Emulation:
    return Emulation(EmulationConfig("lambdascale-testbed1", "llama2-13b", d), 1 << 20)


def bare_autoscaler(
    config: ControllerConfig,
    client: Any = None,
    pool: ParameterPool | None = None,
    nodes: Iterable[int] = (0,),
    clock: Clock = REAL_CLOCK,
    started_s: float | None = None,
) -> Autoscaler:
    """The controller's autoscaler over no deployments: `client` (a `ScriptedClient` unless
    given) for every op, `nodes` live, its `Copies` started at `started_s` (default: now on
    `clock`)."""
    client = ScriptedClient() if client is None else client
    pool = ParameterPool() if pool is None else pool
    live = list(nodes)
    started = clock.now_s() if started_s is None else started_s
    copies = Copies(client, pool, {}, config, lambda: live, started, clock)
    return Autoscaler(
        client, pool, Metrics(), config, EngineConfig(), {}, copies, lambda: live, clock=clock
    )
