"""The controller's side of the agents: requests to each agent and one merged event stream.

`ClusterClient` holds one control connection and one event subscription per agent. Events
from all agents are copied to every queue made by `listen()`; an agent whose event stream
ends (it died or stopped) yields an `agent_down` event, so callers never wait on a dead node.
"""

import asyncio
import contextlib
import logging
import time
from typing import Any

from surge.runtime.transport import Connection, ConnectionClosed, connect

log = logging.getLogger(__name__)


class ClusterClient:
    """Control connections to a set of agents, by node id."""

    def __init__(self, addresses: dict[int, tuple[str, int]], token: str) -> None:
        self.addresses = dict(addresses)
        self.token = token
        self.conns: dict[int, Connection] = {}
        self._listeners: list[asyncio.Queue[dict[str, Any]]] = []
        self._data_pool: dict[int, list[Connection]] = {}
        self.down: set[int] = set()
        self._readers: list[asyncio.Task] = []

    async def connect(self) -> None:
        async def one(node: int) -> None:
            host, port = self.addresses[node]
            self.conns[node] = await connect(host, port, self.token, "controller")
            sub = await connect(host, port, self.token, "controller-events")
            await sub.request({"op": "subscribe"})
            self._readers.append(
                asyncio.get_running_loop().create_task(self._read_events(node, sub))
            )

        await asyncio.gather(*(one(n) for n in self.addresses))

    async def _read_events(self, node: int, sub: Connection) -> None:
        try:
            while True:
                header, _ = await sub.recv()
                self._publish(header)
        except (ConnectionClosed, OSError) as e:
            log.info("event stream of node %d ended: %s", node, e)
        finally:
            sub.close()
            self.down.add(node)
            self._publish({"kind": "event", "type": "agent_down", "node": node, "t": time.time()})

    def _publish(self, event: dict[str, Any]) -> None:
        for q in self._listeners:
            q.put_nowait(event)

    def listen(self) -> asyncio.Queue[dict[str, Any]]:
        """A new queue that receives every event from now on (each consumer its own)."""
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._listeners.append(q)
        return q

    def unlisten(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        if q in self._listeners:
            self._listeners.remove(q)

    async def exchange(
        self, node: int, header: dict[str, Any], payload: bytes | memoryview = b""
    ) -> tuple[dict[str, Any], memoryview]:
        """A request with a payload answer, on a pooled connection of its own, so that many
        may be in flight to one agent at once (micro-batches of a pipeline)."""
        free = self._data_pool.setdefault(node, [])
        conn = free.pop() if free else None
        if conn is None or conn.closed:
            host, port = self.addresses[node]
            conn = await connect(host, port, self.token, "controller-data")
        try:
            reply, body = await conn.request(header, payload)
        except BaseException:
            conn.close()
            raise
        free.append(conn)
        return reply, body

    async def request(
        self, node: int, header: dict[str, Any], payload: bytes = b""
    ) -> dict[str, Any]:
        reply, _ = await self.conns[node].request(header, payload)
        return reply

    async def broadcast(
        self, header: dict[str, Any], nodes: list[int] | None = None
    ) -> dict[int, dict]:
        nodes = sorted(self.conns) if nodes is None else nodes
        replies = await asyncio.gather(*(self.request(n, header) for n in nodes))
        return dict(zip(nodes, replies, strict=True))

    async def close(self) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for conn in [*self.conns.values(), *(c for cs in self._data_pool.values() for c in cs)]:
            conn.close()
