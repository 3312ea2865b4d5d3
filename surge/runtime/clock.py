"""The serving plane's clock: the one place control-plane time is read and waited on.

What flows: the controller builds one `Clock` at start (`Clock(time_dilation=D)` from
`ControllerConfig.emulation`, else the real clock) and passes it to its collaborators
(autoscaler, host copies, admission's hold timeouts, P/D and FlexPipe loops) and to each
deployment's `Server`, which stamps its requests (arrival, dispatch, tokens, done) with it;
the runtime's scale-outs read it through `ctx.server.clock`.

Under GPU-time emulation (docs/emulation.md) an emulated second lasts D real seconds. Like
a time-dilated guest's clock (DieCast, NSDI '07 §3), this clock runs D times slower than
the host's: `now_s` is emulated seconds and `sleep(s)` waits D x s real seconds. So every
constant of the control plane — the autoscaler's tick and windows, keep-alives, hold
timeouts, SLOs, ParaServe's and FlexPipe's windows, BlitzScale's tokens/s targets — keeps
the value its paper or the user gave, in emulated seconds, and nothing multiplies by D but
this class. Without emulation D = 1 and it is `time.monotonic` and `asyncio.sleep`.
Owned by runtime/.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable


class Clock:
    """Seconds as the serving plane counts them: an emulated second lasts `time_dilation`
    real ones (monotonic; its origin means nothing, only differences do)."""

    def __init__(
        self,
        time_dilation: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not time_dilation > 0:
            raise ValueError(f"a clock's time dilation must be > 0 (got {time_dilation})")
        self.time_dilation = time_dilation
        """D: real seconds per second of this clock."""
        self._monotonic, self._sleep = monotonic, sleep

    def now_s(self) -> float:
        """Now, in this clock's seconds."""
        return self._monotonic() / self.time_dilation

    def real_s(self, clock_s: float) -> float:
        """How many real seconds `clock_s` of this clock's seconds last."""
        return clock_s * self.time_dilation

    def of_real(self, real_s: float) -> float:
        """A time or span measured in real seconds elsewhere (an agent's wall-clock
        stamps), in this clock's seconds."""
        return real_s / self.time_dilation

    async def sleep(self, clock_s: float) -> None:
        """Wait `clock_s` of this clock's seconds."""
        await self._sleep(self.real_s(clock_s))

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        """Wait until `event` is set or `timeout_s` of this clock's seconds pass; whether
        it was set. (asyncio.wait, not wait_for: Python 3.11's wait_for can swallow a
        cancel that lands as its timeout fires, and a stop would wait forever.)"""
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({waiter}, timeout=self.real_s(timeout_s))
        finally:
            waiter.cancel()
        return event.is_set()


REAL_CLOCK = Clock()
"""The host's own clock (D = 1): what runs without emulation."""
