"""The gate a node's engines compile their decode graphs behind: set only while the node is
quiet, or serves only and has deferred the compile `compile_defer_max_s`
(`surge.policy.compile_gate`), so no compile holds the agent's GIL while a scale-out's blocks
move (`surge.engine.compiled`, docs/engine.md).

What flows: every `POLL_S` the agent's `activity()` (holding: an op about a model running or
left running, a load, a block sent or pulled, a multicast; serving: a request in a local
instance, a pipeline stage's step) in; the gate (a `threading.Event`, which every
`ModelRunner` of the node is given as its `compile_gate`) set or cleared, out. A graph
whose compile has begun finishes; the next waits.
Owned by the node agent (`runtime/node/agent.py`).
"""

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from surge.policy.compile_gate import Activity, may_compile, observe

log = logging.getLogger(__name__)

POLL_S = 0.1
"""How often the gate follows the node's state: a burst's first request closes it within
this (plus the event loop's lag) for the graphs not begun yet."""


class CompileQuiet:
    """The node's compile gate and the watch that opens and closes it."""

    def __init__(
        self,
        activity: Callable[[], tuple[bool, bool]],
        quiet_s: float,
        defer_max_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.activity, self.clock = activity, clock
        """(holding, serving) now: `surge.policy.compile_gate.observe`."""
        self.quiet_s, self.defer_max_s = quiet_s, defer_max_s
        self.gate = threading.Event()
        """Set while the node's engines may compile (each `DecodeGraph` waits on it)."""
        self.seen = Activity()

    def touch(self) -> None:
        """An op about a model began on the node now (a load, a transfer, a multicast): close
        the gate at once (not at the next poll), so a graph due this instant waits."""
        self.seen = observe(self.seen, self.clock(), True, False, self.quiet_s)
        self.gate.clear()

    def update(self) -> bool:
        """Follow the node's state now; whether compiles may start."""
        now_s = self.clock()
        holding, serving = self.activity()
        self.seen = observe(self.seen, now_s, holding, serving, self.quiet_s)
        if may_compile(self.seen, now_s, self.quiet_s, self.defer_max_s):
            if not self.gate.is_set():
                log.info(
                    "node %s: decode-graph compiles may run",
                    "serving, compile deferred its bound" if serving else "quiet",
                )
                self.gate.set()
            return True
        self.gate.clear()
        return False

    async def watch(self) -> None:
        """`update` every `POLL_S` until cancelled (the agent closes)."""
        while True:
            self.update()
            await asyncio.sleep(POLL_S)
