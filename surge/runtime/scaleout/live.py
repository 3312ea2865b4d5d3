"""BlitzScale live scaling (§4, §5.2) while multicast receivers load.

In: the context, and the blocks each receiver holds (the loading state machine's own sets,
so there is one record of who holds what). A receiver joins when the state machine says
`GoLive` and leaves at `GoLocal`. Out: batches of queued requests that have not started
are prefilled cooperatively — the first T layers on the live receiver, the rest on a
serving local instance (the overloaded "old" one), which then decodes them with the whole
KV cache (`runtime/consolidation.py` `live_prefill`). T per batch comes from the paper's
best-effort zigzag schedule (`policy.zigzag.best_effort`) shaped by the system's
`live_load_ratio`, clipped to the layers the receiver holds at that moment; batches are
`live_batch` requests (both `SystemConfig` fields). A failed step puts its requests back
at the head of the queue. Counts go to `ctx.live_prefilled`.
"""

import asyncio
import contextlib
import logging
import math

from surge.policy.zigzag import ZigzagProblem, best_effort
from surge.runtime.consolidation import live_prefill
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.scaleout.context import ScaleOutContext, held_layers

log = logging.getLogger(__name__)

POLL_S = 0.05
"""How often the queue is looked at (requests arrive without telling this loop)."""


class LiveScaling:
    """Live scaling of one multicast's receivers."""

    def __init__(self, ctx: ScaleOutContext, held: dict[int, set[int]]) -> None:
        self.ctx = ctx
        self.held = held
        """Receiver agent -> blocks it holds (the loading state's sets, read only)."""
        self.live: set[int] = set()
        self._splits: list[tuple[int, int]] = []

    def go_live(self, node: int) -> None:
        self.live.add(node)

    def go_local(self, node: int) -> None:
        self.live.discard(node)

    def start(self) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(self._loop())

    async def stop(self, task: asyncio.Task) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            await self.step()

    async def step(self) -> None:
        """One look at the queue: prefill one batch cooperatively if it can be."""
        ctx = self.ctx
        server, manifest, system = ctx.server, ctx.manifest, ctx.system
        num_layers = manifest.arch.num_layers
        olds = [
            e
            for e in server.endpoints.values()
            if isinstance(e, LocalEndpoint) and not e.failed and e.node not in self.held
        ]
        waiting = [r for r in server.queue if not r.output_token_ids and not r.done.is_set()]
        layers = {
            n: held_layers(manifest, self.held[n])
            for n in sorted(self.live)
            if n not in ctx.client.down
        }
        if not olds or not waiting or not layers:
            return
        new = max(layers, key=lambda n: (layers[n], -n))
        if layers[new] < 1:
            return
        if not self._splits:  # a fresh schedule for the batches waiting now
            problem = ZigzagProblem(
                num_layers=num_layers,
                load_ratio=system.live_load_ratio,
                num_batches=max(1, math.ceil(len(waiting) / system.live_batch)),
                resident_layers_at_start=min(layers[new], num_layers),
            )
            self._splits = list(best_effort(problem).splits)
        t = min(self._splits.pop(0)[0], layers[new], num_layers - 1)
        if t < 1:
            return  # this batch runs on the old instance alone (normal routing)
        old = min(olds, key=lambda e: (e.outstanding, e.name))
        batch = waiting[: system.live_batch]
        server.queue[:] = [r for r in server.queue if r not in batch]
        try:
            await live_prefill(server, manifest, new, old, t, batch)
            ctx.live_prefilled += len(batch)
        except Exception as e:
            log.info("live prefill on node %d failed (%s); requests re-queued", new, e)
            await server.requeue(batch)
