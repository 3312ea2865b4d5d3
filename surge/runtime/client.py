"""The controller's side of the agents: requests to each agent and one merged event stream.

`ClusterClient` holds one control connection and one event subscription per agent. Events
from all agents arrive on one asyncio queue; an agent whose event stream ends (it died or
stopped) yields an `agent_down` event, so callers never wait on a dead node.
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
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
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
                await self.events.put(header)
        except (ConnectionClosed, OSError) as e:
            log.info("event stream of node %d ended: %s", node, e)
        finally:
            sub.close()
            self.down.add(node)
            await self.events.put(
                {"kind": "event", "type": "agent_down", "node": node, "t": time.time()}
            )

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
        for conn in self.conns.values():
            conn.close()
