"""P/D disaggregation in the serving runtime (BlitzScale §5.2, §6): roles, hand-off, mutation.

What flows: the `Server` of a P/D deployment holds one `PdServing`. Each local instance
gets a role when it joins (`policy.pd.role_for_new`, sent as `instance_role`); new
requests go only to prefill instances (`policy.pd.routable`). A prefill instance parks
each request after its prefill (`runtime/node/pd.py`) and says so with its first token
(`finish_reason == HANDOFF_REASON`); `handoff` then takes the parked K/V off it
(`instance_handoff`: typed header + raw bytes) and gives it to the decode instance
`policy.pd.handoff_target` picks, which adopts it and decodes on, token-exact
(`runtime/consolidation.py`'s adoption, the KV migration ParaServe consolidation uses).
`mutate` turns a prefill instance into a decode one without touching its weights (§5.2),
when `control/pd.py` says so from `policy.pd.decide_mutation`. `load` is what the monitor
sees: per instance its role, requests, tokens/s over `RATE_WINDOW_S` and KV use.

Failures lose no request: a request is on exactly one of {an endpoint, the queue} at each
await, so if the prefill agent dies before its K/V is taken, or the decode agent while it
adopts, the request goes back to the head of the queue with its tokens and is prefilled
again (`Server.requeue`). Owned by the runtime; decisions are `surge.policy.blitzscale.pd`'s.
"""

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from surge.policy.autoscale import RATE_WINDOW_S
from surge.policy.blitzscale import pd
from surge.runtime.consolidation import adopt
from surge.runtime.endpoints import Endpoint, LocalEndpoint
from surge.runtime.protocol import (
    HANDOFF_REASON,
    InstanceHandoffOp,
    InstanceRoleOp,
    KvPart,
    TokenGenerated,
)
from surge.runtime.request import ServeRequest

if TYPE_CHECKING:
    from surge.runtime.server import Server

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _InHand:
    """A request prefilled by live scaling whose K/V the controller holds."""

    req: ServeRequest
    parts: list[KvPart]
    payload: bytes
    num_cached: int
    old: LocalEndpoint


class PdServing:
    """The P/D side of one deployment's server."""

    def __init__(
        self, server: "Server", targets: pd.PdTargets, max_kv_tokens: int, mutation: bool = False
    ) -> None:
        self.server, self.targets, self.max_kv_tokens = server, targets, max_kv_tokens
        self.mutation = mutation
        """The system mutates prefill instances (new ones past the targets prefill)."""
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
        self.in_hand: list[_InHand] = []
        """Live-prefilled requests whose K/V is here, waiting for decode room (FIFO)."""
        self._drainer: asyncio.Task | None = None
        self._joining: dict[str, str] = {}
        """Roles of instances being told theirs (not yet in `roles`)."""

    # ---- roles and routing ----------------------------------------------------------

    def _locals(self) -> list[tuple[int, LocalEndpoint]]:
        """Serving local instances with a role, by age (their index is their age)."""
        return [
            (i, e)
            for i, e in enumerate(self.server.endpoints.values())
            if isinstance(e, LocalEndpoint) and not e.failed and e.name in self.roles
        ]

    async def assign(self, ep: LocalEndpoint) -> None:
        """Give a joining local instance its role (before it takes any request). Instances
        joining at once (a scale-out's destinations) count each other's roles: each is
        booked in `_joining` before the agent is told, or both would see the same counts
        (two prefill instances and no decode one for 1:1 targets)."""
        roles = [self.roles[e.name] for _, e in self._locals()] + list(self._joining.values())
        num_prefill, num_decode = roles.count(pd.PREFILL), roles.count(pd.DECODE)
        role = pd.role_for_new(num_prefill, num_decode, self.targets, self.mutation)
        self._joining[ep.name] = role
        try:
            await self.server.client.call(ep.node, InstanceRoleOp(instance=ep.name, role=role))  # type: ignore[arg-type]
        finally:
            self._joining.pop(ep.name, None)
        self.roles[ep.name] = role
        log.info("%s joins as a %s instance", ep.name, role)

    def forget(self, name: str) -> None:
        self.roles.pop(name, None)
        self._token_times.pop(name, None)

    def routable(self, live: dict[int, Endpoint]) -> dict[int, Endpoint]:
        """The endpoints new requests may go to (`policy.pd.routable`). Execution pipelines
        and instances without a role are decode-like: they serve only when no instance
        prefills."""
        view = [self._view(i, e) for i, e in live.items()]
        keep = set(pd.routable([v for v in view if v is not None]))
        if not keep:
            return live
        return {i: e for i, e in live.items() if i in keep}

    def _view(self, index: int, e: Endpoint, now_s: float | None = None) -> pd.PdInstance | None:
        role = self.roles.get(e.name)
        if role is None:
            return None
        held = sum(len(r.prompt_token_ids) + len(r.output_token_ids) for r in e.requests.values())
        times = self._token_times.get(e.name, ())
        rate = 0.0
        if now_s is not None:
            rate = sum(1 for t in times if t >= now_s - RATE_WINDOW_S) / RATE_WINDOW_S
        parked = sum(1 for src, _ in self.pending if src is e)
        return pd.PdInstance(
            index=index,
            role=role,
            parked=parked,
            outstanding=e.outstanding,
            capacity=max(1, e.capacity),
            tokens_per_s=rate,
            kv_usage=min(1.0, held / self.max_kv_tokens) if self.max_kv_tokens else 0.0,
        )

    def load(self, now_s: float, since_last_mutation_s: float) -> pd.PdLoad:
        """The deployment as `policy.pd` sees it (the monitor's input)."""
        views = [self._view(i, e, now_s) for i, e in self._locals()]
        return pd.PdLoad(
            instances=tuple(v for v in views if v is not None),
            num_waiting=len(self.server.queue),
            num_handoffs_waiting=len(self.pending) + len(self.in_hand),
            since_last_mutation_s=since_last_mutation_s,
        )

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
        """Hand off what can go now (a task: called from event handlers and ticks)."""
        if (self.pending or self.in_hand) and (self._drainer is None or self._drainer.done()):
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

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
        self.in_hand.append(_InHand(req, parts, payload, num_cached, old))
        self.kick()

    async def _drain(self) -> None:
        """Hand waiting requests off, oldest first, while decode instances have room: K/V
        already here first (nothing else holds it), then K/V parked on prefill instances."""
        while self.in_hand:
            held = self.in_hand[0]
            if held.req.done.is_set():
                self.in_hand.pop(0)
                continue
            views = [v for i, e in self._locals() if (v := self._view(i, e)) is not None]
            index = pd.handoff_target(-1, views)
            target = (
                held.old if index == -1 else self.endpoint_at(index) if index is not None else None
            )
            if target is None:
                return  # every decode instance is full
            self.in_hand.pop(0)
            try:
                await adopt(
                    self.server,
                    target,
                    held.req,
                    num_cached=held.num_cached,
                    parts=held.parts,
                    payload=held.payload,
                )
                self.num_handoffs += 1
            except Exception as e:  # its agent died or has no room: prefill it again
                log.info("%s could not adopt %s (%s)", target.name, held.req.req_id, e)
                self.num_handoff_retries += 1
                await self.server.requeue([held.req])
        while self.pending:
            src, req = self.pending[0]
            if req.req_id not in src.requests or src.failed:
                self.pending.pop(0)  # retired meanwhile: it is back in the queue already
                continue
            src_index = next((i for i, e in self._locals() if e is src), -1)
            views = [v for i, e in self._locals() if (v := self._view(i, e)) is not None]
            index = pd.handoff_target(src_index, views)
            target = None if index is None else self.endpoint_at(index)
            if target is None:
                return  # every decode instance is full: the K/V waits where it is
            self.pending.pop(0)
            await self.handoff(src, req, target)

    async def handoff(self, src: LocalEndpoint, req: ServeRequest, target: LocalEndpoint) -> None:
        """Move a request parked on prefill instance `src` to `target`."""
        server = self.server
        if src.requests.pop(req.req_id, None) is None:
            return  # retired meanwhile: the request is back in the queue already
        try:
            reply, body = await server.client.call_bytes(
                src.node, InstanceHandoffOp(instance=src.name, req_id=req.req_id)
            )
        except Exception as e:  # the prefill agent died, or it lost the request
            log.info("hand-off of %s from %s failed (%s); prefill again", req.req_id, src.name, e)
            self.num_handoff_retries += 1
            await server.requeue([req])
            return
        missing = list(reply.output_token_ids[len(req.output_token_ids) :])
        for tok in missing:  # tokens the agent made that had not arrived here yet
            req.add_token(tok, False, None)
        payload = bytes(body)
        for ep in dict.fromkeys(t for t in (target, src) if not t.failed):
            try:
                await adopt(
                    server,
                    ep,
                    req,
                    num_cached=reply.num_cached,
                    parts=[reply.part],
                    payload=payload,
                )
            except Exception as e:  # the decode agent died, or it has no room after all
                log.info("%s could not adopt %s (%s)", ep.name, req.req_id, e)
                if not server.unplaced(req):
                    return  # its agent died mid-call and the retirement requeued it
                continue
            self.num_handoffs += 1
            return
        self.num_handoff_retries += 1
        await server.requeue([req])

    # ---- mutation ---------------------------------------------------------------

    async def mutate(self, ep: LocalEndpoint) -> None:
        """Turn prefill instance `ep` into a decode instance; its weights stay (§5.2)."""
        await self.server.client.call(ep.node, InstanceRoleOp(instance=ep.name, role="decode"))
        self.roles[ep.name] = pd.DECODE
        self.num_mutations += 1
        self.mutated.append(ep.name)
        log.info("mutation: %s is now a decode instance", ep.name)
        self.kick()
        await self.server.dispatch()

    async def close(self) -> None:
        if self._drainer is not None:
            self._drainer.cancel()
