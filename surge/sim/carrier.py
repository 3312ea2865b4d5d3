"""One multicast's loading actions, carried out one at a time as the runtime does.

In: the actions `surge.policy.loading.LoadingState` returns as blocks land, in order. Out:
each action handed to the loader's `carry_out` when the runtime's carrier
(`runtime/scaleout/multicast.LoadingCarrier`) would get to it. That carrier awaits each action
before it takes the next, and opening an endpoint costs the controller time:
- a local instance (`GoLocal`): `SimSettings.endpoint_open_s` (`InstanceOpenOp` and the
  `Server.add_endpoint` that dispatches its first requests, `runtime/scaleout/local.py`);
- an execution pipeline (`OpenPipeline`): `SimSettings.pipeline_open_s` (one
  `StageOpenOp` per stage, the head engines, its first dispatch).
So endpoints that become ready together open one after another, and actions behind an
opening (a `RetirePipeline`, a `GoLive`) wait for it. Both costs are seconds with the
cores free; with `SimSettings.shared_cores` an opening stretches by the processor share
at its start (`ComputeSharing.share`), as every other consumer of those cores does
(measured by `benchmarks/sim_calibrate_measure.measure_endpoint_open`). No decision is
made here: what opens, and when it may, is the policy's.
"""

import collections
from collections.abc import Callable

from surge.policy.loading import GoLocal, OpenPipeline
from surge.sim.events import EventLoop, Priority
from surge.sim.settings import SimSettings


class Carrier:
    """The queue of one multicast's loading actions."""

    def __init__(
        self,
        loop: EventLoop,
        key: int,
        settings: SimSettings,
        share: Callable[[], float],
        carry_out: Callable[[object], None],
    ) -> None:
        self.loop, self.key = loop, key
        self.endpoint_open_s = settings.endpoint_open_s
        self.pipeline_open_s = settings.pipeline_open_s
        self.share = share
        """The processor share an opening gets now (1.0 without shared cores)."""
        self.carry_out = carry_out
        self.queue: collections.deque[object] = collections.deque()
        self.opening = False
        """An endpoint is being opened: the actions behind it wait."""

    def cost_s(self, action: object) -> float:
        """Controller seconds (cores free) to carry `action` out."""
        if isinstance(action, GoLocal):
            return self.endpoint_open_s
        if isinstance(action, OpenPipeline):
            return self.pipeline_open_s
        return 0.0

    def submit(self, action: object) -> None:
        """`action` came back from the loading state machine (in order)."""
        self.queue.append(action)
        if not self.opening:
            self._next()

    def _next(self) -> None:
        while self.queue:
            action = self.queue.popleft()
            cost = self.cost_s(action)
            if cost <= 0:
                self.carry_out(action)
                continue
            self.opening = True
            done_s = self.loop.now_s + cost / self.share()
            self.loop.schedule(done_s, Priority.INSTANCE, self.key, lambda a=action: self._done(a))
            return

    def _done(self, action: object) -> None:
        self.opening = False
        self.carry_out(action)
        self._next()
