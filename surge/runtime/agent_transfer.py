"""How an agent moves blocks: serving them to peers and pulling them in plan order.

A multicast is carried out without a global barrier (λScale §6): each receiver pulls its
blocks from their sources in its plan order, one at a time (single ingress port); each
sender serves pulls as soon as it holds a verified copy, one at a time (single egress
port), lowest plan step first (`EgressPort`). A block is checked against its manifest
checksum on arrival; a bad one is pulled again, and a pull that cannot complete (peer
down, repeated corruption) is reported so the controller can name another holder
(`pull_from`). Peers are reached over a pool of pre-opened connections (BlitzScale §5.3).

A mixin of `NodeAgent` (`runtime/agent.py`), which owns the tiers, events and lifecycle.
"""

import asyncio
import contextlib
import heapq
import itertools
import logging

from surge.errors import SurgeError
from surge.model.manifest import verify_block
from surge.runtime.transport import (
    AuthError,
    Connection,
    ConnectionClosed,
    RemoteError,
    connect,
)

log = logging.getLogger(__name__)

MAX_PULL_ATTEMPTS = 2
"""Pulls of one block from one source before reporting it as failed (checksum mismatches)."""


def import_engine() -> None:
    """Import the engine (torch, ~1.5 s) — at start-up, or while the first block travels."""
    import surge.engine.runner  # noqa: F401


class EgressPort:
    """One send at a time, lowest plan step first (the single-port model of a plan)."""

    def __init__(self) -> None:
        self._busy = False
        self._waiting: list[tuple[float, int, asyncio.Future]] = []
        self._seq = itertools.count()

    @contextlib.asynccontextmanager
    async def slot(self, priority: float):
        if self._busy or self._waiting:
            fut = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (priority, next(self._seq), fut))
            await fut
        self._busy = True
        try:
            yield
        finally:
            self._busy = False
            while self._waiting:
                _, _, fut = heapq.heappop(self._waiting)
                if not fut.done():
                    self._busy = True
                    fut.set_result(None)
                    break


class TransferOps:
    """Mixin of `NodeAgent`: the block data path. Expects the agent's attributes."""

    async def op_get_block(self, conn: Connection, h: dict, p: memoryview) -> None:
        """Send a block, once held, when the egress port's plan order allows."""
        name, block = h["model"], int(h["block"])
        state = self.model(name)
        wait_s = float(h.get("wait_s", 0.0))
        # Only verified blocks are served: a buffer being (re)filled is not "held" yet.
        if not state.event(block).is_set():
            if wait_s <= 0:
                await conn.send({"ok": False, "error": f"node {self.node} lacks block {block}"})
                return
            try:
                await asyncio.wait_for(state.event(block).wait(), wait_s)
            except TimeoutError:
                await conn.send({"ok": False, "error": f"node {self.node} never got block {block}"})
                return
        async with self.port_out.slot(float(h.get("step", 1e9))):
            buf = self.buffer_of(name, block) if state.event(block).is_set() else None
            if buf is None:
                await conn.send({"ok": False, "error": f"node {self.node} evicted block {block}"})
                return
            if self._corrupt_left > 0:  # fault injection for tests
                self._corrupt_left -= 1
                bad = bytearray(buf)
                bad[len(bad) // 2] ^= 0xFF
                buf = memoryview(bad)
            await conn.send({"ok": True, "model": name, "block": block}, buf)
            self.bytes_out += len(buf)

    async def _peer(self, node: int) -> Connection:
        """The pooled connection to a peer (opened once, reopened if it broke)."""
        lock = self._pool_locks.setdefault(node, asyncio.Lock())
        async with lock:
            conn = self._pool.get(node)
            if conn is None or conn.closed:
                if node not in self.peers:
                    raise ConnectionClosed(f"node {node} is not a known peer")
                host, port = self.peers[node]
                conn = await connect(
                    host, port, self.config.token, f"node-{self.node}", self.egress, self.ingress
                )
                self._pool[node] = conn
            return conn

    async def pull(
        self, name: str, block: int, src: int, tier: str, step: float, wait_s: float
    ) -> memoryview:
        """Read one block from a peer straight into its tier buffer and verify it."""
        info = self.model(name).manifest.blocks[block]
        target = self.target_buffer(name, block, tier)
        conn = await self._peer(src)
        try:
            await conn.request(
                {"op": "get_block", "model": name, "block": block, "step": step, "wait_s": wait_s},
                sink=lambda _h: target,
            )
        except ConnectionClosed:
            conn.close()
            raise
        self.bytes_in += info.size_bytes

        verify_block(info, target)  # raises SurgeError naming the block on a bad checksum
        return target

    # ---- multicast ---------------------------------------------------------------

    async def op_multicast(self, conn: Connection, h: dict, p: memoryview) -> dict:
        """Start this node's part of a plan: pull `recv` in order; `send` is served on demand."""
        name, tier, mc = h["model"], h.get("tier", "host"), h["mc_id"]
        self.model(name)
        recv = sorted((int(s), int(b), int(src)) for s, b, src in h["recv"])
        if tier == "gpu":  # import the engine (torch, ~1.5 s) while the first block travels
            self._spawn(asyncio.to_thread(import_engine))
        wait_s = float(h.get("wait_s", 120.0))
        self._spawn(self._receive_all(mc, name, tier, recv, wait_s))
        return {"mc_id": mc, "num_recv": len(recv)}

    async def _receive_all(self, mc: str, name: str, tier: str, recv: list, wait_s: float) -> None:
        for step, block, src in recv:
            await self._receive_one(mc, name, tier, step, block, src, wait_s)
        await self.emit({"type": "receive_done", "mc_id": mc, "model": name})

    async def _receive_one(
        self, mc: str, name: str, tier: str, step: float, block: int, src: int, wait_s: float
    ) -> bool:
        if self.model(name).event(block).is_set():
            return True
        reason = ""
        for _ in range(MAX_PULL_ATTEMPTS):
            try:
                buf = await self.pull(name, block, src, tier, step, wait_s)
            except SurgeError as e:  # checksum mismatch: pull again
                reason = str(e)
                log.warning("node %d: %s", self.node, e)
                await self.emit(
                    {"type": "corrupt", "mc_id": mc, "model": name, "block": block, "src": src}
                )
                continue
            except (TimeoutError, ConnectionClosed, AuthError, OSError, RemoteError) as e:
                reason = f"{type(e).__name__}: {e}"
                break
            await self.landed(name, block, tier, buf, mc_id=mc, src=src, step=step)
            return True
        await self.emit(
            {
                "type": "pull_failed",
                "mc_id": mc,
                "model": name,
                "block": block,
                "src": src,
                "reason": reason,
            }
        )
        return False

    async def op_pull_from(self, conn: Connection, h: dict, p: memoryview) -> dict:
        """The controller re-planned a failed delivery: pull `block` from `src` now."""
        self._spawn(
            self._receive_one(
                h["mc_id"],
                h["model"],
                h.get("tier", "host"),
                float(h.get("step", 0)),
                int(h["block"]),
                int(h["src"]),
                float(h.get("wait_s", 120.0)),
            )
        )
        return {}
