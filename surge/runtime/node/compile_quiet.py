"""The gate a node's engines compile their decode graphs behind: set only while the node is
quiet (`surge.policy.compile_gate.may_compile`), so no compile holds the agent's GIL while a
scale-out's blocks move or requests are served (`surge.engine.compiled`, docs/engine.md).

What flows: every `POLL_S` the agent's `busy()` (an op about a model running or left running:
a load, a block sent or pulled, a multicast; a request in a local instance; a pipeline stage's
step) in; the gate (a `threading.Event`, which every `ModelRunner` of the node is given as its
`compile_gate`) set or cleared, out. A graph whose compile has begun finishes; the next waits.
Owned by the node agent (`runtime/node/agent.py`).
"""

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from surge.policy.compile_gate import may_compile

log = logging.getLogger(__name__)

POLL_S = 0.1
"""How often the gate follows the node's state: a burst's first request closes it within
this (plus the event loop's lag) for the graphs not begun yet."""


class CompileQuiet:
    """The node's compile gate and the watch that opens and closes it."""

    def __init__(
        self,
        busy: Callable[[], bool],
        quiet_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.busy, self.quiet_s, self.clock = busy, quiet_s, clock
        self.gate = threading.Event()
        """Set while the node's engines may compile (each `DecodeGraph` waits on it)."""
        self.last_busy_s: float | None = None

    def touch(self) -> None:
        """Something began on the node now: close the gate at once (not at the next poll),
        so a graph due this instant waits."""
        self.last_busy_s = self.clock()
        self.gate.clear()

    def update(self) -> bool:
        """Follow the node's state now; whether compiles may start."""
        now_s, busy = self.clock(), self.busy()
        if busy:
            self.last_busy_s = now_s
        if may_compile(busy, now_s, self.last_busy_s, self.quiet_s):
            if not self.gate.is_set():
                log.debug("node quiet for %.1f s: decode-graph compiles may run", self.quiet_s)
                self.gate.set()
            return True
        self.gate.clear()
        return False

    async def watch(self) -> None:
        """`update` every `POLL_S` until cancelled (the agent closes)."""
        while True:
            self.update()
            await asyncio.sleep(POLL_S)
