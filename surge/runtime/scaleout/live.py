"""BlitzScale live scaling (§4, §5.2) while multicast receivers load.

In: the context, the blocks each receiver holds (the loading state machine's own sets, so
there is one record of who holds what) and, from `multicast.py`, when each block reached
a receiver (`arrived`). A receiver joins when the state machine says `GoLive` and leaves at
`GoLocal`. Each look at the queue (every `POLL_S`):
1. the SLO check (`policy.live_scaling.needs_live_scaling`): the queued requests' predicted
   TTFT under normal routing — the queue's measured drain rate (`Server.departures`), the
   serving instances' measured prefill time (`Server.prefill_spans`), the new instance
   whole after its remaining layers at the measured load speed — against the deployment's
   TTFT SLO (`ctx.ttft_slo_s`). When it holds, requests stay on normal routing;
2. Time_l measured on this run (`measured_load_ratio`: layer load time from this
   receiver's block arrivals / one layer's execution time for the batch from the serving
   instances' prefill time), the system's `live_load_ratio` until both are measured;
3. a schedule for the batches waiting now (`choose_schedule`: the zigzag ILP of Eq. 1 when
   it beats best effort on predicted average latency, else best effort); each batch of
   `live_batch` requests is prefilled cooperatively — the first T layers on the live
   receiver, the rest on a serving local instance (the overloaded "old" one), which then
   decodes them (`runtime/consolidation.py` `live_prefill`); under P/D the K/V goes to a
   decode instance instead, as soon as one has room (`runtime/pd_handoff.py`
   `PdServing.hold`). Zigzag waits for the layers its split needs (the queue keeps being
   routed normally meanwhile, §5.2 "the delay won't waste GPU"); best effort is clipped to
   the layers held. A failed step puts its requests back at the head of the queue.
When a receiver holds every layer and serves, `redistribute` spreads the old instances'
requests evenly onto it (§5.2 step 3, `plan_redistribution`): moved requests continue
there token-exact (aborted on the old instance, re-prefilled over prompt + output).
Records on the context: `live_prefilled`, `live_batches` per schedule, `live_declined`,
`live_load_ratios`, `live_redistributed`; each batch is a `LiveBatch` event.
"""

import asyncio
import contextlib
import functools
import logging
import math
import time

from surge.events import LiveBatch
from surge.policy.blitzscale.live_scaling import (
    InstanceLoad,
    LoadRatio,
    PrefillSpan,
    SloCheck,
    choose_schedule,
    drain_rate_per_s,
    layer_load_s,
    measured_load_ratio,
    needs_live_scaling,
    plan_redistribution,
    prefill_s_per_token,
)
from surge.policy.blitzscale.zigzag import ZigzagProblem
from surge.runtime.consolidation import live_prefill
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.request import ServeRequest
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
        self._arrivals: dict[int, list[tuple[float, int]]] = {n: [] for n in held}
        """Receiver -> (time, layers in the block) of each block that landed."""
        self._splits: list[tuple[int, int]] = []
        self._schedule = "best_effort"
        self._ratio = LoadRatio(ctx.system.live_load_ratio, False)
        self._stopping = False

    def go_live(self, node: int) -> None:
        self.live.add(node)

    def go_local(self, node: int) -> None:
        self.live.discard(node)

    def arrived(self, node: int, block: int, t_s: float) -> None:
        """A block landed on receiver `node` at `t_s` (wall clock, as its agent says)."""
        if node in self._arrivals:
            b = self.ctx.manifest.blocks[block]
            self._arrivals[node].append((t_s, b.end_layer - b.first_layer))

    def start(self) -> asyncio.Task:
        """Start looking at the queue (as the multicast starts: its start time is each
        receiver's zero, so the first block already measures the load speed)."""
        now = time.time()  # the agents' events carry wall-clock times
        for arrivals in self._arrivals.values():
            arrivals.append((now, 0))
        loop = asyncio.get_running_loop()
        self._warm = loop.run_in_executor(None, self._warm_solver)  # while layers load
        return loop.create_task(self._loop())

    @staticmethod
    def _warm_solver() -> None:
        """Import the ILP solver (~0.5 s) before the first schedule needs it."""
        import scipy.optimize  # noqa: F401

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

    # ---- what was measured -------------------------------------------------------

    def _prefill_s_per_token(self) -> float | None:
        spans = [PrefillSpan(a, b, n) for a, b, n in self.ctx.server.prefill_spans]
        return prefill_s_per_token(spans)

    def _slo_holds(self, waiting: list[ServeRequest], num_serving: int, whole_in_s) -> bool:
        ctx, now = self.ctx, time.monotonic()
        per_token = self._prefill_s_per_token()
        mean_tokens = sum(len(r.prompt_token_ids) for r in waiting) / len(waiting)
        check = SloCheck(
            now_s=now,
            queued_arrivals_s=tuple(r.arrival_t for r in waiting),
            ttft_slo_s=ctx.ttft_slo_s,
            drain_per_s=drain_rate_per_s(ctx.server.departures, now),
            prefill_s_per_request=None if per_token is None else per_token * mean_tokens,
            num_serving=num_serving,
            whole_in_s=whole_in_s,
        )
        return not needs_live_scaling(check).live

    # ---- one look at the queue ------------------------------------------------------

    async def step(self) -> None:
        """One look at the queue: prefill one batch cooperatively if the SLO needs it."""
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
        load_s = layer_load_s(self._arrivals.get(new, []))
        whole_in_s = None if load_s is None else (num_layers - layers[new]) * load_s
        pd = server.pd
        serving = [e for e in olds if pd is None or pd.roles.get(e.name, "prefill") == "prefill"]
        if self._slo_holds(waiting, max(1, len(serving)), whole_in_s):
            ctx.live_declined += 1
            self._splits = []  # a fresh schedule if live scaling is needed again
            return
        if not self._ratio.measured and load_s is not None and self._prefill_s_per_token():
            self._splits = []  # Time_l is measured now: re-plan with it, not the fallback
        if not self._splits:  # a fresh schedule for the batches waiting now
            self._ratio = measured_load_ratio(
                load_s,
                self._prefill_s_per_token(),
                sum(len(r.prompt_token_ids) for r in waiting[: system.live_batch]),
                num_layers,
                system.live_load_ratio,
            )
            problem = ZigzagProblem(
                num_layers=num_layers,
                load_ratio=self._ratio.value,
                num_batches=max(1, math.ceil(len(waiting) / system.live_batch)),
                resident_layers_at_start=min(layers[new], num_layers),
            )
            schedule = await asyncio.to_thread(choose_schedule, problem)
            self._splits, self._schedule = list(schedule.splits), schedule.policy
            ctx.live_load_ratios.append(self._ratio)
            log.info(
                "live scaling: %s schedule, Time_l %.3g (%s), %d batches",
                schedule.policy,
                self._ratio.value,
                "measured" if self._ratio.measured else "fallback",
                problem.num_batches,
            )
        want = self._splits[0][0]
        if self._schedule == "zigzag" and want > layers[new] and want < num_layers:
            return  # zigzag: this batch waits for its layers; normal routing goes on
        self._splits.pop(0)
        t = min(want, layers[new], num_layers - 1)
        if t < 1:
            return  # this batch runs on the old instance alone (normal routing)
        # The queue may have moved while the schedule was solved: take the batch now.
        waiting = [r for r in server.queue if not r.output_token_ids and not r.done.is_set()]
        batch = waiting[: system.live_batch]
        if batch:
            old = min(olds, key=lambda e: (e.outstanding, e.name))
            await self._run_batch(new, old, t, batch)

    async def _run_batch(
        self, new: int, old: LocalEndpoint, t: int, batch: list[ServeRequest]
    ) -> None:
        ctx, server = self.ctx, self.ctx.server
        server.take(batch)
        # P/D: a decode instance adopts each one as soon as one has room.
        deliver = None if server.pd is None else functools.partial(server.pd.hold, old=old)
        try:
            await live_prefill(server, ctx.manifest, new, old, t, batch, deliver)
            ctx.live_prefilled += len(batch)
            ctx.live_batches[self._schedule] = ctx.live_batches.get(self._schedule, 0) + 1
            ev = LiveBatch(
                model=ctx.model,
                new_node=new,
                old_node=old.node,
                split_layer=t,
                num_requests=len(batch),
                schedule=self._schedule,
                load_ratio=self._ratio.value,
                load_ratio_measured=self._ratio.measured,
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

    # ---- the new instance is whole ---------------------------------------------------

    async def redistribute(self, node: int) -> None:
        """Receiver `node` holds every layer and is about to serve: spread the old
        instances' requests evenly onto it (§5.2 step 3). Called before it opens, so the
        moved requests — admitted before anything still queued — are routed to it first
        (FIFO). Under P/D nothing moves here: `opened` lets the K/V waiting for decode
        room go to it, and the queue is routed as usual."""
        ctx, server = self.ctx, self.ctx.server
        if server.pd is not None:
            return
        new = ctx.local_endpoint(node)
        olds = {
            i: e
            for i, e in enumerate(server.endpoints.values())
            if isinstance(e, LocalEndpoint) and not e.failed and e.node != node
        }
        moves = plan_redistribution(
            [InstanceLoad(i, e.outstanding, e.capacity) for i, e in olds.items()],
            InstanceLoad(-1, 0, new.capacity),
        )
        for move in moves:
            old = olds[move.from_index]
            # The newest first: they are the ones still waiting on the old instance.
            reqs = [r for r in reversed(old.requests.values()) if not r.done.is_set()]
            reqs = await old.abort(reqs[: move.num_requests])
            ctx.live_redistributed += len(reqs)
            log.info("redistribution: %d requests %s -> %s", len(reqs), old.name, new.name)
            # At the head of the queue, not routed yet: the new instance opens next.
            server.put_back(reqs)

    def opened(self) -> None:
        """The whole receiver serves now: under P/D, hand-offs waiting for decode room
        may go to it at once."""
        if self.ctx.server.pd is not None:
            self.ctx.server.pd.kick()
