"""BlitzScale live scaling (§4, §5.2) while multicast receivers load.

In: the context, and the blocks each receiver holds (the loading state machine's own sets,
so there is one record of who holds what). A receiver joins when the state machine says
`GoLive` and leaves at `GoLocal`. Out: batches of queued requests that have not started
are prefilled cooperatively — the first T layers on the live receiver, the rest on a
serving local instance (the overloaded "old" one), which then decodes them with the whole
KV cache (`runtime/consolidation.py` `live_prefill`) — under P/D the K/V goes to a decode
instance instead, as soon as one has room (`runtime/pd_handoff.py` `PdServing.hold`).
T per batch comes from the paper's best-effort zigzag schedule (`policy.zigzag.best_effort`)
shaped by the system's
`live_load_ratio`, clipped to the layers the receiver holds at that moment; batches are
`live_batch` requests (both `SystemConfig` fields). A failed step puts its requests back
at the head of the queue. Counts go to `ctx.live_prefilled`.
"""

import asyncio
import contextlib
import functools
import logging
import math

from surge.events import LiveBatch
from surge.policy.zigzag import ZigzagProblem, best_effort
from surge.runtime.consolidation import live_prefill
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.scaleout.context import ScaleOutContext, held_layers

log = logging.getLogger(__name__)

POLL_S = 0.05
"""How often the queue is looked at (requests arrive without telling this loop)."""
STOP_WAIT_S = 30.0
"""How long `stop` lets a step in progress finish before cancelling it."""


class LiveScaling:
    """Live scaling of one multicast's receivers."""

    def __init__(self, ctx: ScaleOutContext, held: dict[int, set[int]]) -> None:
        self.ctx = ctx
        self.held = held
        """Receiver agent -> blocks it holds (the loading state's sets, read only)."""
        self.live: set[int] = set()
        self._splits: list[tuple[int, int]] = []
        self._stopping = False

    def go_live(self, node: int) -> None:
        self.live.add(node)

    def go_local(self, node: int) -> None:
        self.live.discard(node)

    def start(self) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(self._loop())

    async def stop(self, task: asyncio.Task) -> None:
        """Stop after the step in progress: cancelling a step midway would leave its
        requests neither queued nor on an instance."""
        self._stopping = True
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_WAIT_S)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        except Exception as e:  # the loop itself failed: nothing is left in flight
            log.warning("live scaling ended with %s", e)

    async def _loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(POLL_S)
            if not self._stopping:
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
        # P/D: a decode instance adopts each one as soon as one has room.
        deliver = None if server.pd is None else functools.partial(server.pd.hold, old=old)
        try:
            await live_prefill(server, manifest, new, old, t, batch, deliver)
            ctx.live_prefilled += len(batch)
            ev = LiveBatch(
                model=ctx.model,
                new_node=new,
                old_node=old.node,
                split_layer=t,
                num_requests=len(batch),
            )
            ctx.events.publish(ev)
        except BaseException as e:  # failed, or cancelled by a stop that could not wait
            log.info("live prefill on node %d failed (%r); requests re-queued", new, e)
            # An adoption that failed midway left its request on `old` without the agent
            # holding it: take the batch off `old` and route it again (a prefill rebuilds
            # the cache from the tokens it has; none is lost or repeated).
            await old.abort(batch)
            await server.requeue(batch)
            if not isinstance(e, Exception):
                raise
