"""BlitzScale live scaling (§4, §5.2) while multicast receivers load.

In: the context, the blocks each receiver holds (the loading state machine's own sets, so
there is one record of who holds what) and, from `multicast.py`, when each block reached
a receiver (`arrived`). A receiver joins when the state machine says `GoLive` and leaves at
`GoLocal`. Each look at the queue — at once when a receiver goes live or a block a pending
batch waits for lands, else every `LOOK_INTERVAL_S`, as the simulator's — builds a
`LiveView` of the receiver holding the most layers
(`policy.blitzscale.live_scaling.pick_target`): the layers it holds,
the serving local instances (sources; under P/D the prefill ones count in the SLO check),
the requests that have not started — the router's queue and those queued on the sources'
agents (`LocalEndpoint.queued`, read and taken by `live_queue.py`; BlitzScale §4 step 1:
"we redirect all queued requests from inst.0") —, and what this run measured — seconds per layer
from its block arrivals, the serving instances' prefill time per token
(`Server.prefill_spans`), the queue's drain rate (`Server.departures`). Its
`LiveScalingState.look` decides (the SLO check against `ctx.ttft_slo_s`, the schedule,
waiting for layers, the split, the source: the overloaded instance the receiver pairs with,
none another live receiver's, and the requests: the router's queue and that partner's,
`live_pair`, §5.2); this file carries out a `RunBatch`: its
requests taken (off the router's queue, or back from a source's agent,
`LocalEndpoint.take_queued`, which does not wait for that agent's step), the first T
layers on the receiver, the rest on the source, which then decodes them
(`runtime/migration/consolidation.py` `live_prefill`); under P/D, when the source is a prefill
instance, the K/V goes to a decode instance instead, as soon as one has room
(`runtime/migration/pd_handoff.py` `PdServing.hold`; `live_delivery`). The schedule
is solved in a worker thread (the ILP may take tens of ms). A batch runs as its own task,
so up to `LiveSettings.max_in_flight` of a target's batches are in flight at once (started,
first tokens not back; one handing its requests on is not, as in the simulator): the
target runs batch i+1's first layers while the source runs batch i's rest (Fig. 12b's
cross-batch overlap, which the zigzag ILP schedules; each batch's stage compute spans
are recorded in `live_spans`). A zigzag batch waiting for layers is woken by the block
arrival that brings them (`LiveScalingState.wakes`, §5.2 (2) preemption), not by the
next poll. A failed batch puts its requests back at the head of the queue.
When a receiver that went live holds every layer and serves, `redistribute` takes the
old instances' queued requests that have not started back to the router, which spreads
them over every instance, the new one first (§5.2 step 3,
`policy.blitzscale.live_scaling.redistributed`, as the simulator); under P/D too.
Records on the context: `live_prefilled`, `live_batches` per schedule, `live_declined`,
`live_load_ratios`, `live_redistributed`; each batch is a `LiveBatch` event.
"""

import asyncio
import contextlib
import functools
import logging
import time

from surge.events import LiveBatch
from surge.policy.blitzscale.handoff import decodes_where_prefilled
from surge.policy.blitzscale.live_pair import LiveSource, takes_from
from surge.policy.blitzscale.live_scaling import (
    LOOK_INTERVAL_S,
    Decline,
    LiveScalingState,
    LiveSettings,
    LiveView,
    RunBatch,
    layer_load_s,
    pick_target,
    redistributed,
)
from surge.policy.blitzscale.pd import PREFILL
from surge.policy.blitzscale.slo_check import PrefillSpan, drain_rate_per_s, prefill_s_per_token
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.consolidation import Deliver, live_prefill
from surge.runtime.migration.failures import failure_level
from surge.runtime.request import ServeRequest
from surge.runtime.scaleout.context import ScaleOutContext, held_layers
from surge.runtime.scaleout.live_queue import (
    Queued,
    not_started,
    queued_on,
    routed,
    take,
    take_back,
    waiting_view,
)
from surge.runtime.server import Server

log = logging.getLogger(__name__)

STOP_WAIT_S = 30.0
"""How long `stop` lets a step in progress finish before cancelling it (seconds of the
serving clock, emulated under GPU-time emulation)."""


def live_delivery(server: Server, old: LocalEndpoint) -> tuple[bool, Deliver | None]:
    """Where a live batch whose last layers ran on `old` decodes (`live_prefill`'s `keep`,
    `deliver`): on `old` itself (its agent adopts each request, its own layers' K/V in
    place and the new instance's part pulled agent to agent), unless `old` is a P/D
    prefill instance (`policy.blitzscale.handoff.decodes_where_prefilled`, as the simulator's
    engines decide) — or, under P/D, a request it has no room for: a decode instance
    adopts those as soon as one has room (`PdServing.hold`, the K/V relayed here). Before,
    a decode source's own K/V always left its NIC and came back (the emulated §6.1 run:
    it slowed the multicast that NIC was sending)."""
    pd = server.pd
    if pd is None:
        return True, None
    keep = decodes_where_prefilled(pd.roles.get(old.name, PREFILL))
    return keep, functools.partial(pd.hold, old=old)


def _drop_live(old: LocalEndpoint, batch: list[ServeRequest]) -> None:
    """The batch's requests leave `old`'s live load (`LocalEndpoint.live`)."""
    ids = {id(r) for r in batch}
    old.live[:] = [r for r in old.live if id(r) not in ids]


class LiveScaling:
    """Live scaling of one multicast's receivers."""

    def __init__(self, ctx: ScaleOutContext, held: dict[int, set[int]]) -> None:
        self.ctx = ctx
        self.held = held
        """Receiver agent -> blocks it holds (the loading state's sets, read only)."""
        self.live: set[int] = set()
        self.was_live: set[int] = set()
        """Receivers that went live and have not redistributed yet (§5.2 step 3)."""
        self._arrivals: dict[int, list[tuple[float, int]]] = {n: [] for n in held}
        """Receiver -> (time, layers in the block) of each block that landed."""
        self._states: dict[int, LiveScalingState] = {}
        """Receiver -> its cooperative batches (the policy's state machine)."""
        self._stopping = False
        self._running: dict[int, dict[asyncio.Task, list[ServeRequest]]] = {}
        """Receiver -> its batches under way (task -> the batch's requests), until each
        request is handed on; in flight only until its first tokens are back (`_in_flight`)."""
        self._wake = asyncio.Event()
        """Set when a block lands that a pending zigzag batch waited for."""

    def go_live(self, node: int) -> None:
        """`node` may serve cooperatively: looked at at once, as the simulator's `go_live`
        (not at the next poll)."""
        self.live.add(node)
        self.was_live.add(node)
        self._wake.set()

    def go_local(self, node: int) -> None:
        self.live.discard(node)

    def arrived(self, node: int, block: int, t_s: float) -> None:
        """A block landed on receiver `node` at `t_s` (wall clock, as its agent says; kept
        in the serving clock's seconds, as the prefill spans it is weighed against)."""
        if node in self._arrivals:
            b = self.ctx.manifest.blocks[block]
            t = self.ctx.server.clock.of_real(t_s)
            self._arrivals[node].append((t, b.end_layer - b.first_layer))
        state = self._states.get(node)
        # The loading state adds `block` after this call: count it in already.
        if state is not None and state.wakes(
            held_layers(self.ctx.manifest, self.held[node] | {block})
        ):
            self.ctx.report.live_woken += 1
            self._wake.set()

    def start(self) -> asyncio.Task:
        """Start looking at the queue (as the multicast starts: its start time is each
        receiver's zero, so the first block already measures the load speed)."""
        now = self.ctx.server.clock.of_real(time.time())  # agents stamp wall-clock times
        for arrivals in self._arrivals.values():
            arrivals.append((now, 0))
        # The ILP's solver was imported ahead (`scaleout/ilp_warmup.py`): the first look
        # comes as the first block lands and must not wait for it.
        return asyncio.get_running_loop().create_task(self._loop())

    async def stop(self, task: asyncio.Task) -> None:
        """Stop after the step in progress: cancelling a step midway would leave its
        requests neither queued nor on an instance."""
        self._stopping = True
        self._wake.set()
        try:
            wait_s = self.ctx.server.clock.real_s(STOP_WAIT_S)
            async with asyncio.timeout(wait_s):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        except Exception as e:  # the loop itself failed: nothing is left in flight
            log.warning("live scaling ended with %s", e)

    async def _loop(self) -> None:
        started = False
        poll_s = self.ctx.server.clock.real_s(LOOK_INTERVAL_S)  # on the serving clock
        try:
            while not self._stopping:
                if not started:  # a batch just started: look again at once (the next)
                    with contextlib.suppress(TimeoutError):  # a poll, or a layer landed
                        async with asyncio.timeout(poll_s):
                            await self._wake.wait()
                self._wake.clear()
                started = not self._stopping and await self.step()
        finally:  # the batches under way finish (or are cancelled with the loop)
            running = [t for ts in self._running.values() for t in ts]
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    # ---- one look at the queue ------------------------------------------------------

    def _view(
        self, new: int, held: int, olds: list[LocalEndpoint], waiting: list[Queued]
    ) -> LiveView:
        """Receiver `new` and the queue as `LiveScalingState.look` sees them now."""
        server = self.ctx.server
        now = server.clock.now_s()
        pd = server.pd
        spans = [PrefillSpan(a, b, n) for a, b, n in server.prefill_spans]
        return LiveView(
            now_s=now,
            held_layers=held,
            sources=tuple(
                LiveSource(
                    e.node,
                    e.outstanding,
                    prefills=pd is None or pd.roles.get(e.name, "prefill") == "prefill",
                )
                for e in olds
            ),
            waiting=waiting_view(waiting),
            layer_load_s=layer_load_s(self._arrivals.get(new, [])),
            prefill_s_per_token=prefill_s_per_token(spans),
            drain_per_s=drain_rate_per_s(server.departures, now),
            in_flight=self._in_flight(new),
            paired_elsewhere=frozenset(
                st.partner
                for n, st in self._states.items()
                if n != new and n in self.live and st.partner is not None
            ),
        )

    def _state(self, node: int) -> LiveScalingState:
        ctx = self.ctx
        if node not in self._states:
            settings = LiveSettings(
                num_layers=ctx.manifest.arch.num_layers,
                live_batch=ctx.system.live_batch,
                fallback_load_ratio=ctx.system.live_load_ratio,
                decode_partners=ctx.system.live_decode_partners,
                least_loaded=ctx.system.live_least_loaded,
                ttft_slo_s=ctx.ttft_slo_s,
            )
            self._states[node] = LiveScalingState(settings)
        return self._states[node]

    async def step(self) -> bool:
        """One look at the queue: carry out what `LiveScalingState.look` says; whether a
        batch started."""
        ctx, server = self.ctx, self.ctx.server
        olds = [
            e
            for e in server.endpoints.values()
            if isinstance(e, LocalEndpoint) and not e.failed and e.node not in self.held
        ]
        layers = {
            n: held_layers(ctx.manifest, self.held[n])
            for n in sorted(self.live)
            if n not in ctx.client.down
        }
        new = pick_target(layers)
        if new is None:
            return False
        state = self._state(new)
        solved = state.num_schedules
        waiting = await not_started(server, olds)
        view = self._view(new, layers[new], olds, waiting)
        action = await asyncio.to_thread(state.look, view)
        if state.num_schedules != solved:
            ctx.report.live_load_ratios.append(state.ratio)
            log.info(
                "live scaling: %s schedule, Time_l %.3g (%s), %d batches",
                state.schedule.policy if state.schedule else "?",
                state.ratio.value,
                "measured" if state.ratio.measured else "fallback",
                state.problem.num_batches if state.problem else 0,
            )
        if isinstance(action, Decline) and action.reason == "slo":
            ctx.report.live_declined += 1
        if not isinstance(action, RunBatch):
            return False  # normal routing goes on (a zigzag batch may wait for its layers)
        old = next((e for e in olds if e.node == action.source), None)
        if old is None:
            return False
        # The router's queue may have moved while the schedule was solved: the batch is the
        # oldest of what waits now, by the same rule (`takes_from`: the router's queue and
        # the partner's, §5.2); a source's request that started meanwhile stays there.
        now = routed(server) + [(r, e) for r, e in waiting if e is not None]
        chosen = takes_from(waiting_view(now), action.queues)[: action.num_requests]
        batch = await take(server, [now[i] for i in chosen])
        if not batch:
            return False
        task = asyncio.get_running_loop().create_task(self._run_batch(new, old, action, batch))
        running = self._running.setdefault(new, {})
        running[task] = batch
        task.add_done_callback(lambda t: running.pop(t, None))
        return True

    def _in_flight(self, new: int) -> int:
        """Receiver `new`'s batches whose first tokens have not come back (`LiveView
        .in_flight`, the simulator's `_Target.in_flight`): a batch handing its requests on
        (K/V to a decode instance, or adopted by its source) is under way but not in
        flight. Until 2026-11-29 it counted until its last hand-off: on the emulated §6.1
        7B run live batch 8-11's first tokens came at 1.682 s and its hand-offs ended at
        2.414, so every look from 1.687 declined as busy and the target was whole (2.079 s)
        after 2 batches of 7 requests, where the simulator ran 4 of 15 (docs/emulation.md)."""
        batches = self._running.get(new, {}).values()
        return sum(1 for batch in batches if any(not r.output_token_ids for r in batch))

    async def _run_batch(
        self, new: int, old: LocalEndpoint, action: RunBatch, batch: list[ServeRequest]
    ) -> None:
        ctx, server = self.ctx, self.ctx.server
        t, schedule, ratio = action.split, action.schedule, action.load_ratio
        keep, deliver = live_delivery(server, old)
        started_s = server.clock.now_s()
        old.live.extend(batch)  # its load while it runs their last layers
        try:
            spans = await live_prefill(server, ctx.manifest, new, old, t, batch, deliver, keep)
            ctx.report.live_spans.append((action.index, schedule, spans))
            ctx.report.live_prefilled += len(batch)
            ctx.report.live_batches[schedule] = ctx.report.live_batches.get(schedule, 0) + 1
            ev = LiveBatch(
                model=ctx.model,
                new_node=new,
                old_node=old.node,
                split_layer=t,
                num_requests=len(batch),
                schedule=schedule,
                load_ratio=ratio.value,
                load_ratio_measured=ratio.measured,
                took_s=round(server.clock.now_s() - started_s, 4),
            )
            ctx.events.publish(ev)
        except BaseException as e:  # failed, or cancelled by a stop that could not wait
            log.log(failure_level(e), "live prefill on node %d failed (%r); re-queued", new, e)
            # An adoption that failed midway left its request on `old` without the agent
            # holding it: take the batch off `old` and route it again (a prefill rebuilds
            # the cache from the tokens it has; none is lost or repeated).
            _drop_live(old, batch)
            await old.abort(batch)
            await server.requeue(batch)
            if not isinstance(e, Exception):
                raise
        finally:
            _drop_live(old, batch)

    # ---- the new instance is whole ---------------------------------------------------

    async def redistribute(self, node: int) -> None:
        """Receiver `node` went live, holds every layer and serves now: the requests queued
        on the other instances that have not started go back through the router
        (`redistributed`, §5.2 step 3), which spreads them over every instance, `node`
        (holding nothing) first — under P/D too, where the new instance prefills: left on
        the old prefill instance, it idled and the monitor's mutation rule took it for
        decode (the emulated §6.1 run, docs/emulation.md). As the simulator does
        (`sim/live_scaling.redistribute`). Before, a share of every request (started ones
        re-prefilled) moved, and nothing under P/D."""
        if node not in self.was_live:
            return
        self.was_live.discard(node)
        server = self.ctx.server
        olds = [
            e
            for e in server.endpoints.values()
            if isinstance(e, LocalEndpoint) and not e.failed and e.node != node
        ]
        queued = await queued_on(olds)
        chosen = [queued[i] for i in redistributed(waiting_view(queued))]
        got = {id(r) for r in await take_back(chosen)}
        moved = [r for r, _ in chosen if id(r) in got]
        if moved:
            self.ctx.report.live_redistributed += len(moved)
            log.info("redistribution: %d queued requests back to the router", len(moved))
            await server.requeue(moved)

    def opened(self) -> None:
        """The whole receiver serves now: under P/D, hand-offs waiting for decode room
        may go to it at once."""
        if self.ctx.server.pd is not None:
            self.ctx.server.pd.kick()
