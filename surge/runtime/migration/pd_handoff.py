"""P/D disaggregation in the serving runtime (BlitzScale §5.2, §6): roles, hand-off, mutation.

What flows: the `Server` of a P/D deployment holds one `PdServing`. Each local instance
gets a role when it joins (`policy.blitzscale.pd.role_for_new` on the deployment's load, sent as
`instance_role`); new requests go only to prefill instances (`policy.blitzscale.pd.routable`; with
none serving they wait at the router while one is joining). A
prefill instance parks each request after its prefill (`runtime/node/pd.py`) and says
so with its first token (`finish_reason == HANDOFF_REASON`); `handoff` then moves the
parked K/V (`pd_transfer.py`) to the decode instance
`policy.blitzscale.handoff.handoff_target` picks (it waits while none serves but one
loads), which adopts it and decodes on. Hand-offs run in parallel, one at a time per
(source, target) pair:
each prefill instance sends its K/V to the decode instances over its own NIC (BlitzScale
§3 Fig. 8a, after DistServe), so pairs do not wait for one another; a pair whose link is
busy leaves its request waiting while later ones take other pairs, and the target's slot
is reserved from the choice until it adopts, so two hand-offs never take the same last
slot.
`mutate` turns a prefill instance into a decode one without touching its weights (§5.2),
when `control/pd.py` says so from `pd_mutation.decide_mutation`. `load` is what the monitor
sees: per instance its role, requests, tokens/s over `RATE_WINDOW_S`, KV use, and the K/V
handed to it over that window as a fraction of its ingress link (`received`, counted by
`runtime/migration/kv_ingress.py`: BlitzScale §5.2's K/V incast; an uncapped link counts
none); a hand-off waiting only for its pair's link is its target's load there, not one
waiting for decode room (`_booked`, as the simulator's).

Failures lose no request (`pd_transfer.py`). Owned by the runtime; decisions are
`surge.policy.blitzscale.pd`'s and `surge.policy.blitzscale.handoff`'s.
"""

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from surge.policy.autoscale import RATE_WINDOW_S
from surge.policy.blitzscale import handoff as pd_handoff
from surge.policy.blitzscale import pd, pd_release
from surge.policy.multicast.topology import NodeLinks
from surge.runtime.endpoints import Endpoint, LocalEndpoint
from surge.runtime.migration.kv_ingress import KvIngress
from surge.runtime.migration.pd_transfer import HERE, InHand, send_held, send_parked
from surge.runtime.protocol import HANDOFF_REASON, InstanceRoleOp, KvPart, TokenGenerated
from surge.runtime.request import ServeRequest

if TYPE_CHECKING:
    from surge.runtime.server import Server

log = logging.getLogger(__name__)


class PdServing:
    """The P/D side of one deployment's server."""

    def __init__(
        self,
        server: "Server",
        targets: pd.PdTargets,
        max_kv_tokens: int,
        mutation: bool = False,
        links: Mapping[int, NodeLinks] | None = None,
        kv_pace: float = 1.0,
        nodes: Callable[[], Collection[int]] = tuple,
    ) -> None:
        self.server, self.targets, self.max_kv_tokens = server, targets, max_kv_tokens
        self.ingress = KvIngress(links if links is not None else {}, server.clock, kv_pace)
        """The K/V handed to each instance over the monitor's window (`received`)."""
        self.kv_pace = kv_pace
        """How the K/V sent from here to a decode agent is paced (GPU-time emulation: the
        K/V's own byte ratio, `control/emulation.kv_pace`; 1: as its bytes)."""
        self.mutation = mutation
        """The system mutates prefill instances (new ones past the targets prefill)."""
        self.nodes = nodes
        """The deployment's slots' nodes: those without a local instance with a role join."""
        self.roles: dict[str, str] = {}
        """Endpoint name -> its role; an endpoint without one serves whole requests."""
        self.num_handoffs = 0
        """Requests whose K/V moved from a prefill instance to a decode instance."""
        self.num_handoff_retries = 0
        """Hand-offs that failed (an agent died) and sent their request back to the queue."""
        self.num_mutations = 0
        """Prefill instances turned into decode instances (§5.2)."""
        self.mutated: list[str] = []
        self._token_times: dict[str, deque[float]] = {}
        self.pending: list[tuple[LocalEndpoint, ServeRequest]] = []
        """Requests parked on a prefill instance, waiting for decode room (FIFO)."""
        self.in_hand: list[InHand] = []
        """Live-prefilled requests whose K/V is here, waiting for decode room (FIFO)."""
        self._in_flight: dict[tuple[str, str], tuple[asyncio.Task, int | None]] = {}
        """(source, target) instance names -> the hand-off on that pair: one at a time per
        pair, pairs in parallel (each over its own NICs, BlitzScale §3 Fig. 8a), with the
        node whose egress it leaves (None: K/V held here, whose source is `HERE`)."""
        self._reserving: set[tuple[str, str]] = set()
        """Pairs whose hand-off has a decode slot reserved on its target: chosen, K/V in
        flight, not yet adopted (`_view` counts it, so two hand-offs never both take the
        last slot)."""
        self.peak_in_flight = 0
        """Most hand-offs in flight at once so far."""
        self._closed = False
        self._joining: dict[str, pd.PdInstance] = {}
        """Instances being told their role (not yet in `roles`), as `policy.blitzscale.pd`
        sees them."""

    # ---- roles and routing ----------------------------------------------------------

    def _locals(self) -> list[tuple[int, LocalEndpoint]]:
        """Serving local instances with a role, by age (their index is their age)."""
        return [
            (i, e)
            for i, e in enumerate(self.server.endpoints.values())
            if isinstance(e, LocalEndpoint) and not e.failed and e.name in self.roles
        ]

    async def assign(self, ep: LocalEndpoint) -> None:
        """Give a joining local instance its role (before it takes any request), on the
        deployment's load. Instances joining at once (a scale-out's destinations) count
        each other: each is booked in `_joining`, holding nothing, before the agent is
        told, or both would see the same deployment (two prefill instances and no decode
        one for 1:1 targets)."""
        load = self.load(self.server.clock.now_s(), float("inf"))
        joining = tuple(self._joining.values())
        load = replace(load, instances=load.instances + joining)
        role = pd.role_for_new(load, self.targets, self.mutation)
        index = -1 - len(joining)  # not a serving instance's index (those are >= 0)
        self._joining[ep.name] = pd.PdInstance(index, role, 0, max(1, ep.capacity))
        try:
            await self.server.client.call(ep.node, InstanceRoleOp(instance=ep.name, role=role))  # type: ignore[arg-type]
        finally:
            self._joining.pop(ep.name, None)
        self.roles[ep.name] = role
        log.info("%s joins as a %s instance", ep.name, role)

    def forget(self, name: str) -> None:
        self.roles.pop(name, None)
        self._token_times.pop(name, None)
        self.ingress.forget(name)

    def received(self, source_node: int | None, target: LocalEndpoint, nbytes: int) -> None:
        """A hand-off's `nbytes` of K/V go to `target` from `source_node` (None: from here);
        the monitor weighs them (`KvIngress.received`)."""
        self.ingress.received(source_node, target.node, target.name, nbytes)

    def routable(self, live: dict[int, Endpoint]) -> dict[int, Endpoint]:
        """The endpoints new requests may go to (`policy.blitzscale.pd.routable`): none while
        no prefill instance serves but a slot still joining will prefill (`prefill_joining`).
        Execution pipelines and instances without a role are decode-like: they serve only
        when no instance prefills or comes."""
        view = [v for i, e in live.items() if (v := self._view(i, e)) is not None]
        coming = self._coming(pd_handoff.prefill_joining, view)
        keep = set(pd.routable(view, coming))
        if not keep and not coming:
            return live
        return {i: e for i, e in live.items() if i in keep}

    def _view(self, index: int, e: Endpoint, now_s: float | None = None) -> pd.PdInstance | None:
        role = self.roles.get(e.name)
        if role is None:
            return None
        held = sum(len(r.prompt_token_ids) + len(r.output_token_ids) for r in e.requests.values())
        times = self._token_times.get(e.name, ())
        rate, ingress = 0.0, 0.0
        if now_s is not None:
            rate = sum(1 for t in times if t >= now_s - RATE_WINDOW_S) / RATE_WINDOW_S
            ingress = self.ingress.usage(e.name, now_s)
        parked = sum(1 for src, _ in self.pending if src is e)
        reserved = sum(1 for _, target in self._reserving if target == e.name)
        return pd.PdInstance(
            index=index,
            role=role,
            parked=parked,
            outstanding=e.outstanding + reserved,
            capacity=max(1, e.capacity),
            tokens_per_s=rate,
            kv_usage=min(1.0, held / self.max_kv_tokens) if self.max_kv_tokens else 0.0,
            kv_ingress_usage=ingress,
        )

    def load(self, now_s: float, since_last_mutation_s: float) -> pd.PdLoad:
        """The deployment as `policy.blitzscale.pd` sees it (the monitor's input). Hand-offs not
        started are booked as `_booked` says: only those no decode instance has room for
        wait for decode room (`PdLoad.num_handoffs_waiting`)."""
        views = [v for i, e in self._locals() if (v := self._view(i, e, now_s)) is not None]
        views, waiting = self._booked(views)
        return pd.PdLoad(
            instances=tuple(views),
            num_waiting=len(self.server.queue),
            num_handoffs_waiting=waiting,
            since_last_mutation_s=since_last_mutation_s,
        )

    def _booked(self, views: list[pd.PdInstance]) -> tuple[list[pd.PdInstance], int]:
        """`views` with each hand-off not started (K/V held here, then parked: `kick`'s
        order) that has a decode instance with room (`_target`, each seeing the ones
        before) booked on it and off its source; and how many have none. A hand-off here
        waits for its (source, target) pair's link (one at a time per pair) where the
        simulator's starts at once, its target's load (`reserved`) from the choice, its
        `parked` only the requests no decode instance has room for. Until 2026-11-29 each
        counted as waiting for decode room: on the emulated §6.1 7B run a look at 4.30 s
        saw "1 prefilled requests wait for decode room" with both decode instances at 3 of 8,
        mutated a prefill instance and scaled out one the simulator does not."""
        at = {v.index: k for k, v in enumerate(views)}
        index_of = {e.name: i for i, e in self._locals()}
        jobs = [(-1, h.old, h.req) for h in self.in_hand if not h.req.done.is_set()]
        jobs += [(index_of.get(src.name, -1), src, req) for src, req in self.pending]
        waiting = 0
        for source, ep, req in jobs:
            target = self._target(source, views)
            if target is None:
                waiting += 1
                continue
            if target in (source, -1) or target not in at:
                continue  # it decodes where it is
            k = at[target]
            views[k] = replace(views[k], outstanding=views[k].outstanding + 1)
            s = at.get(index_of.get(ep.name, -2))
            held_there = req.req_id in ep.requests or any(r is req for r in ep.live)
            if s is not None and held_there:  # off its source, as the simulator's
                v = views[s]
                parked = v.parked - (source != -1)
                views[s] = replace(v, outstanding=v.outstanding - 1, parked=max(0, parked))
        return views, waiting

    def _coming(
        self,
        role_joining: Callable[[pd.PdLoad, pd.PdTargets, int, bool], bool],
        views: list[pd.PdInstance],
    ) -> bool:
        """Whether a slot still joining (no local instance with a role yet) will take a role
        (`role_joining`: `handoff.decode_joining` or `handoff.prefill_joining`)."""
        joined = {e.node for _, e in self._locals()}
        joining = sum(1 for n in self.nodes() if n not in joined)
        return role_joining(pd.PdLoad(tuple(views)), self.targets, joining, self.mutation)

    def _target(self, source: int, views: list[pd.PdInstance]) -> int | None:
        """`handoff_target`, told whether a slot still joining will decode."""
        coming = self._coming(pd_handoff.decode_joining, views)
        return pd_handoff.handoff_target(source, views, coming)

    def releasable(self, release: tuple[int, ...]) -> tuple[int, ...]:
        """Of the autoscaler's `release` (nodes), those to let go
        (`policy.blitzscale.pd_release.releasable`: the instances that stay keep a prefill
        and a decode one), as the simulator's `PdPool.releasable`."""
        index = {e.node: i for i, e in self._locals()}
        # a node without a local instance with a role gets an index none has
        asked = [index.get(node, -1 - n) for n, node in enumerate(release)]
        go = set(pd_release.releasable(asked, self._views()))
        return tuple(node for node, k in zip(release, asked, strict=True) if k in go)

    def endpoint_at(self, index: int) -> LocalEndpoint | None:
        return dict(self._locals()).get(index)

    # ---- tokens and hand-off -------------------------------------------------------

    def on_token(self, ep: Endpoint, ev: TokenGenerated) -> None:
        """A token came back from `ep` (after the endpoint appended it)."""
        times = self._token_times.setdefault(ep.name, deque(maxlen=4096))
        times.append(self.server.clock.now_s())
        if ev.finished:  # room on `ep`: a waiting hand-off may go now
            self.kick()
            return
        if ev.finish_reason != HANDOFF_REASON:
            return
        req = ep.requests.get(ev.req_id)
        if req is None or not isinstance(ep, LocalEndpoint):
            return
        self.pending.append((ep, req))
        self.kick()

    def kick(self) -> None:
        """Start every hand-off that may go now (called from event handlers and ticks, and
        when a hand-off ends)."""
        if self._closed or not (self.pending or self.in_hand):
            return
        if self._start_in_hand():
            self._start_pending()

    async def hold(
        self,
        req: ServeRequest,
        parts: list[KvPart],
        payload: bytes,
        num_cached: int,
        old: LocalEndpoint,
    ) -> None:
        """Take a request whose K/V is here already (live scaling prefilled it, §4) and hand
        it to a decode instance as soon as one has room (`old`, which ran its last layers,
        when nobody decodes)."""
        self.in_hand.append(InHand(req, parts, payload, num_cached, old))
        self.kick()

    def _views(self) -> list[pd.PdInstance]:
        return [v for i, e in self._locals() if (v := self._view(i, e)) is not None]

    def _start_in_hand(self) -> bool:
        """Start the hand-offs of K/V held here, oldest first: every one whose target's
        pair is free. False when every decode instance is full (nothing more may go)."""
        k = 0
        while k < len(self.in_hand):
            held = self.in_hand[k]
            if held.req.done.is_set():
                self.in_hand.pop(k)
                continue
            index = self._target(-1, self._views())
            if index is None:
                return False  # every decode instance is full, or none serves yet
            target = held.old if index == -1 else self.endpoint_at(index)
            if target is None:
                return False
            pair = (HERE, target.name)
            if pair in self._in_flight:
                k += 1  # that link is busy: a later request may take another
                continue
            self.in_hand.pop(k)
            self._start(pair, None, send_held(self, held, target))
        return True

    def _start_pending(self) -> None:
        """Start the hand-offs of K/V parked on prefill instances, oldest first: every one
        whose (source, target) pair is free, while a decode instance has room. Each frees a
        slot on its prefill instance: the queue is routed again at once (as the simulator's
        `Requests.drain` after `_hand_off`), not only at the next arrival or finish."""
        freed = False
        k = 0
        while k < len(self.pending):
            src, req = self.pending[k]
            if req.req_id not in src.requests or src.failed:
                self.pending.pop(k)  # retired meanwhile: it is back in the queue already
                continue
            src_index = next((i for i, e in self._locals() if e is src), -1)
            index = self._target(src_index, self._views())
            target = None if index is None else self.endpoint_at(index)
            if target is None:
                break  # every decode instance is full, or none serves yet: the K/V waits
            pair = (src.name, target.name)
            if pair in self._in_flight:
                k += 1
                continue
            self.pending.pop(k)
            del src.requests[req.req_id]  # off `src` now: its slot frees, `target`'s is reserved
            freed = True
            self._start(pair, src.node, self.handoff(src, req, target))
        if freed:
            self.server.dispatch_soon()

    def _start(self, pair: tuple[str, str], node: int | None, job: Coroutine) -> None:
        """Run one hand-off on `pair` (source, target) from `node`'s egress, the target's
        room reserved until it adopts (`_view` counts it)."""
        self._reserving.add(pair)
        task = asyncio.get_running_loop().create_task(job)
        self._in_flight[pair] = (task, node)
        self.peak_in_flight = max(self.peak_in_flight, len(self._in_flight))
        task.add_done_callback(functools.partial(self._ended, pair))

    def _ended(self, pair: tuple[str, str], task: asyncio.Task) -> None:
        self._reserving.discard(pair)
        self._in_flight.pop(pair, None)
        if not task.cancelled() and (e := task.exception()) is not None:
            log.error("hand-off %s -> %s failed: %r", *pair, e)
        self.kick()  # that pair is free (and maybe some room): the next may go

    def booked(self, pair: tuple[str, str]) -> None:
        """The hand-off on `pair` is being adopted: `adopt` books its room on the target now."""
        self._reserving.discard(pair)

    async def handoff(self, src: LocalEndpoint, req: ServeRequest, target: LocalEndpoint) -> None:
        """Move a request parked on prefill instance `src` (taken off it already) to `target`
        (`pd_transfer.send_parked`)."""
        await send_parked(self, src, req, target)

    # ---- mutation ---------------------------------------------------------------

    async def mutate(self, ep: LocalEndpoint) -> None:
        """Turn prefill instance `ep` into a decode instance; its weights stay (§5.2). The
        agent answers at once (its step under way ends in the new role), so the monitor's
        look that decided it goes on with the deployment as it was at the look, as the
        simulator's `PdPool._mutate` (`tests/parity/test_pd_mutation_parity.py`)."""
        await self.server.client.call(ep.node, InstanceRoleOp(instance=ep.name, role="decode"))
        self.roles[ep.name] = pd.DECODE
        self.num_mutations += 1
        self.mutated.append(ep.name)
        log.info("mutation: %s is now a decode instance", ep.name)
        self.kick()
        await self.server.dispatch()

    def egress_handoffs(self) -> dict[int, int]:
        """Node -> hand-offs whose K/V leaves its egress now or waits there (parked): what
        the multicast planner prunes sources by (BlitzScale §5.1)."""
        out: dict[int, int] = {}
        nodes = [src.node for src, _ in self.pending]
        nodes += [node for _, node in self._in_flight.values() if node is not None]
        for node in nodes:
            out[node] = out.get(node, 0) + 1
        return out

    async def close(self) -> None:
        self._closed = True
        for task, _ in list(self._in_flight.values()):
            task.cancel()
