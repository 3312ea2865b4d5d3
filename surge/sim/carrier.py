"""One multicast's loading actions, carried out one at a time as the runtime does.

In: the actions `surge.policy.loading.LoadingState` returns as blocks land, in order, and
what each costs now (`HostModel.action_s`). Out: each action handed to the loader's
`carry_out` when the runtime's carrier (`runtime/scaleout/multicast.LoadingCarrier`) would
get to it. That carrier awaits each action before it takes the next, so where an action
takes time (on a real GPU cluster none does: `sim/host.DedicatedHost`; the CPU testbed's
endpoint openings do, `benchmarks/sim_calibrate/testbed.py`) endpoints that become ready
together open one after another, and the actions behind an opening (a `RetirePipeline`, a
`GoLive`) wait for it. No decision is made here: what opens, and when it may, is the
policy's.
"""

import collections
from collections.abc import Callable

from surge.sim.events import EventLoop, Priority


class Carrier:
    """The queue of one multicast's loading actions."""

    def __init__(
        self,
        loop: EventLoop,
        key: int,
        action_s: Callable[[object], float],
        carry_out: Callable[[object], None],
    ) -> None:
        self.loop, self.key = loop, key
        self.action_s = action_s
        """Seconds from now an action takes (`HostModel.action_s`)."""
        self.carry_out = carry_out
        self.queue: collections.deque[object] = collections.deque()
        self.opening = False
        """An endpoint is being opened: the actions behind it wait."""

    def submit(self, action: object) -> None:
        """`action` came back from the loading state machine (in order)."""
        self.queue.append(action)
        if not self.opening:
            self._next()

    def _next(self) -> None:
        while self.queue:
            action = self.queue.popleft()
            took_s = self.action_s(action)
            if took_s <= 0:
                self.carry_out(action)
                continue
            self.opening = True
            done_s = self.loop.now_s + took_s
            self.loop.schedule(done_s, Priority.INSTANCE, self.key, lambda a=action: self._done(a))
            return

    def _done(self, action: object) -> None:
        self.opening = False
        self.carry_out(action)
        self._next()
