"""The controller's side of the agents: typed requests to each agent, and their events.

`ClusterClient` holds one control connection and one event subscription per agent.
`call(node, op)` sends a typed op (`runtime/protocol/`) and returns its typed reply;
`call_bytes` does the same on a pooled connection of its own for ops that carry bytes.
`subscribe((EventClass, ...), model=...)` gives a queue of typed events, filtered when they
are published, so a consumer gets only what it asked for. An agent whose event stream ends
(it died or stopped) yields an `AgentDown` event, so callers never wait on a dead node.
"""

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from surge.errors import SurgeError
from surge.runtime.handshake import connect
from surge.runtime.protocol import AgentDown, Event, Op, Reply, SubscribeOp
from surge.runtime.security.tls import ClusterTls
from surge.runtime.transport import (
    STALL_TIMEOUT_S,
    Connection,
    ConnectionClosed,
    check_stall_timeout,
)

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Reply)


@dataclass(eq=False)
class _Subscription:
    """One consumer's queue and what it asked for."""

    queue: asyncio.Queue
    event_types: tuple[type[Event], ...]
    """The event classes it asked for."""
    model: str | None
    """Only events about this model (events about no model, like AgentDown, still pass)."""

    def wants(self, event: Event | None) -> bool:
        if event is None or not isinstance(event, self.event_types):
            return False
        return self.model is None or event.model_name in (None, self.model)


class ClusterClient:
    """Control connections to a set of agents, by node id."""

    def __init__(
        self,
        addresses: dict[int, tuple[str, int]],
        token: str,
        tls: ClusterTls | None = None,
        stall_timeout_s: float = STALL_TIMEOUT_S,
    ) -> None:
        self.addresses = dict(addresses)
        self.token = token
        self.tls = tls.client if tls is not None else None
        """The client TLS context of every connection (None: plain TCP)."""
        self.stall_timeout_s = check_stall_timeout(stall_timeout_s)
        """How long an agent may be silent before its connections fail and it counts as
        down (`transport.STALL_TIMEOUT_S`)."""
        self.conns: dict[int, Connection] = {}
        self._subs: list[_Subscription] = []
        self._data_pool: dict[int, list[Connection]] = {}
        self.down: set[int] = set()
        self._readers: list[asyncio.Task] = []
        self._events: dict[int, Connection] = {}
        """Each node's event-stream connection."""
        self._reopening: dict[int, asyncio.Lock] = {}
        """Per node, held while its control connection is opened again."""

    async def connect(self) -> None:
        await asyncio.gather(*(self._attach(n) for n in self.addresses))

    async def _dial(self, node: int, me: str) -> Connection:
        """A new authenticated connection to `node`, introduced as `me`."""
        host, port = self.addresses[node]
        return await connect(
            host, port, self.token, me, tls=self.tls, stall_timeout_s=self.stall_timeout_s
        )

    async def _attach(self, node: int) -> None:
        self.conns[node] = await self._dial(node, "controller")
        sub = await self._dial(node, "controller-events")
        await sub.request(SubscribeOp().to_json())
        self._events[node] = sub
        self._readers.append(asyncio.get_running_loop().create_task(self._read_events(node, sub)))

    def mark_down(self, node: int) -> None:
        """Treat `node` as gone (it missed its heartbeat): its connections close, so its
        event stream ends with an `AgentDown` and calls waiting on it fail at once."""
        for conn in (self.conns.get(node), self._events.get(node), *self._data_pool.pop(node, [])):
            if conn is not None:
                conn.shut()

    async def reattach(self, node: int, address: tuple[str, int]) -> None:
        """`node` is back (a restarted agent) at `address`: connect to it and take it off
        the down set."""
        self.mark_down(node)
        self.addresses[node] = address
        await self._attach(node)
        self.down.discard(node)

    async def _read_events(self, node: int, sub: Connection) -> None:
        try:
            while True:
                header, _ = await sub.recv()
                try:
                    event: Event | None = Event.decode(header)
                except SurgeError as e:  # a newer agent's event: nobody can read it
                    log.warning("node %d sent an event this client cannot read: %s", node, e)
                    event = None
                self._publish(event)
        except (ConnectionClosed, OSError) as e:
            log.info("event stream of node %d ended: %s", node, e)
        finally:
            sub.close()
            self.down.add(node)
            down = AgentDown(node=node, t=time.time())
            self._publish(down)

    def _publish(self, event: Event | None) -> None:
        for s in self._subs:
            if s.wants(event):
                s.queue.put_nowait(event)

    def subscribe(
        self, event_types: tuple[type[Event], ...], model: str | None = None
    ) -> asyncio.Queue[Event]:
        """A new queue of the events of these classes from now on (about `model`, if given;
        events about no model, like AgentDown, always pass). Call `unsubscribe` when done."""
        if not event_types or not all(issubclass(t, Event) for t in event_types):
            raise SurgeError(f"subscribe needs Event classes (got {event_types!r})")
        q: asyncio.Queue[Event] = asyncio.Queue()
        self._subs.append(_Subscription(q, tuple(event_types), model))
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self._subs = [s for s in self._subs if s.queue is not q]

    async def _exchange(
        self,
        node: int,
        header: dict[str, Any],
        payload: bytes | memoryview = b"",
        pace: float = 1.0,
    ) -> tuple[dict[str, Any], memoryview]:
        """A request with a payload answer, on a pooled connection of its own, so that many
        may be in flight to one agent at once (micro-batches of a pipeline)."""
        free = self._data_pool.setdefault(node, [])
        conn = free.pop() if free else None
        if conn is None or conn.closed:
            conn = await self._dial(node, "controller-data")
        try:
            reply, body = await conn.request(header, payload, pace=pace)
        except BaseException:
            conn.close()
            raise
        free.append(conn)
        return reply, body

    async def call(self, node: int, op: Op[R]) -> R:
        """Send a typed op on the node's control connection; its typed reply (a failure
        raises `RemoteError` with the agent's message). A call cancelled mid-exchange (a
        deleted deployment's load) closes that connection; the next call opens another."""
        conn = await self._control(node)
        reply, _ = await conn.request(op.to_json())
        return cast(R, op.REPLY.from_json(reply))

    async def _control(self, node: int) -> Connection:
        """The node's control connection, opened again if an exchange closed it (not for a
        node that is down: that call fails at once, as before)."""
        conn = self.conns[node]
        if not conn.closed or node in self.down:
            return conn
        async with self._reopening.setdefault(node, asyncio.Lock()):
            conn = self.conns[node]
            if conn.closed and node not in self.down:
                conn = await self._dial(node, "controller")
                self.conns[node] = conn
        return conn

    async def call_bytes(
        self, node: int, op: Op[R], payload: bytes | memoryview = b"", pace: float = 1.0
    ) -> tuple[R, memoryview]:
        """A typed op with a payload and/or a payload answer, on a pooled connection; the
        agent's ingress paces the payload as `pace` times its bytes (`Connection.send`)."""
        reply, body = await self._exchange(node, op.to_json(), payload, pace)
        return cast(R, op.REPLY.from_json(reply)), body

    async def broadcast(self, op: Op[R], nodes: list[int] | None = None) -> dict[int, R]:
        """The same op to several nodes (default: all) at once; replies by node."""
        nodes = sorted(self.conns) if nodes is None else nodes
        replies = await asyncio.gather(*(self.call(n, op) for n in nodes))
        return dict(zip(nodes, replies, strict=True))

    async def close(self) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for conn in [*self.conns.values(), *(c for cs in self._data_pool.values() for c in cs)]:
            conn.close()
