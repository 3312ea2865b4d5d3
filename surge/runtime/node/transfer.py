"""How an agent moves blocks: serving them to peers and pulling them in plan order.

A multicast is carried out without a global barrier (λScale §6): each receiver pulls its
blocks from their sources in its plan order, one at a time (single ingress port); each
sender serves pulls as soon as it holds a verified copy, one at a time (single egress
port), lowest plan step first (`EgressPort`). A block is checked against its manifest
checksum on arrival; a bad one is pulled again, and a pull that cannot complete (peer
down, repeated corruption) is reported so the controller can name another holder
(`pull_from`). Peers are reached over a pool of pre-opened connections (BlitzScale §5.3).

Composed into `NodeAgent` (`runtime/node/agent.py`) with the node's `NodeContext` and its
`AgentStore` (where blocks land) passed in.
"""

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import time

from surge.errors import SurgeError
from surge.model.manifest import RunningChecksum, verify_block
from surge.policy.versions import refuse_as_source
from surge.runtime.handshake import AuthError
from surge.runtime.node.context import Handlers, NodeContext, import_engine
from surge.runtime.node.store import AgentStore
from surge.runtime.protocol import (
    Ack,
    BlockCorrupt,
    BlockReply,
    GetBlockOp,
    LandingTier,
    LinkReport,
    MulticastOp,
    MulticastReply,
    PullFailed,
    PullFromOp,
    ReceiveDone,
    SetPeersOp,
    SetPeersReply,
    ok_header,
)
from surge.runtime.transport import Connection, ConnectionClosed, RemoteError

log = logging.getLogger(__name__)

MAX_PULL_ATTEMPTS = 2
"""Pulls of one block from one source before reporting it as failed (checksum mismatches)."""
MAX_UNSENT_BYTES = 64 << 10
"""A send holds the egress port until at most this much of its block is still on its way
(`Connection.wait_sent`): about one GSO segment, so the next send starts as this one ends."""


class EgressPort:
    """One send at a time, lowest plan step first (the single-port model of a plan). A send
    holds the port until its bytes have left the socket (`MAX_UNSENT_BYTES`).

    A free port is granted on the next loop iteration, not to whichever pull reaches it
    first: pulls woken together (a block just landed that several peers wait for) all
    queue before the grant, so the lowest plan step goes first. Granting at once served
    them in wake-up order, and a step-1 pull that lost to a step-2 one delayed every
    block downstream of its receiver (seen in the netns multicast timelines)."""

    def __init__(self) -> None:
        self._busy = False
        self._granting = False
        self._waiting: list[tuple[float, int, asyncio.Future]] = []
        self._seq = itertools.count()

    @contextlib.asynccontextmanager
    async def slot(self, priority: float):
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._seq), fut))
        self._schedule_grant()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted, then cancelled: give it back
                self._release()
            raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        self._busy = False
        self._schedule_grant()

    def _schedule_grant(self) -> None:
        if not self._busy and self._waiting and not self._granting:
            self._granting = True
            asyncio.get_running_loop().call_soon(self._grant)

    def _grant(self) -> None:
        self._granting = False
        if self._busy:
            return
        while self._waiting:
            _, _, fut = heapq.heappop(self._waiting)
            if not fut.done():
                self._busy = True
                fut.set_result(None)
                return


class AgentTransfer:
    """The block data path of one node: serves `get_block`, runs multicast receive lists."""

    def __init__(self, ctx: NodeContext, store: AgentStore) -> None:
        self.ctx, self.store = ctx, store
        self.port_out = EgressPort()
        self._pool: dict[int, Connection] = {}
        self._pool_locks: dict[int, asyncio.Lock] = {}
        self.bytes_in = 0
        self.bytes_out = 0
        self._corrupt_left = ctx.config.fault_corrupt_sends

    def handlers(self) -> Handlers:
        return {
            GetBlockOp: self.op_get_block,
            MulticastOp: self.op_multicast,
            PullFromOp: self.op_pull_from,
            SetPeersOp: self.op_set_peers,
        }

    def close(self) -> None:
        for conn in self._pool.values():
            conn.close()

    async def op_set_peers(self, op: SetPeersOp, conn: Connection, p: memoryview) -> SetPeersReply:
        """Learn peer addresses and pre-open a connection to each (BlitzScale §5.3 pool)."""
        self.ctx.peers.clear()
        self.ctx.peers.update(op.peers)
        if op.preconnect:
            others = [n for n in self.ctx.peers if n != self.ctx.node]
            await asyncio.gather(*(self._peer(n) for n in others), return_exceptions=True)
        c = self.ctx.config
        shares = await asyncio.to_thread(_shares_device, c.engine.device)
        links = LinkReport(c.egress_gbps, c.ingress_gbps, c.host_group, c.host_gbps, shares)
        return SetPeersReply(peers=tuple(sorted(self.ctx.peers)), links=links)

    async def op_get_block(self, op: GetBlockOp, conn: Connection, p: memoryview) -> None:
        """Send a block, once held, when the egress port's plan order allows."""
        node, block = self.ctx.node, op.block
        state = self.store.model(op.model)
        state.block(block)
        refused = refuse_as_source(op.model, node, state.manifest.digest, op.digest)
        if refused is not None:
            raise SurgeError(refused)
        held = state.event(block)
        # Only verified blocks are served: a buffer being (re)filled is not "held" yet.
        if not held.is_set():
            if op.wait_s <= 0:
                raise SurgeError(f"node {node} lacks block {block}")
            try:
                async with asyncio.timeout(op.wait_s):
                    await held.wait()
            except TimeoutError:
                raise SurgeError(f"node {node} never got block {block}") from None
        async with self.port_out.slot(op.step):
            buf = self.store.buffer_of(op.model, block) if held.is_set() else None
            if buf is None:
                raise SurgeError(f"node {node} evicted block {block}")
            if self._corrupt_left > 0:  # fault injection for tests
                self._corrupt_left -= 1
                bad = bytearray(buf)
                bad[len(bad) // 2] ^= 0xFF
                buf = memoryview(bad)
            reply = BlockReply(model=op.model, block=block)
            # emulated: the block costs one emulated block on both ends' links (the
            # receiver reads the charge from the header); the kernel's tc on netns
            # shapes bytes alone
            await conn.send(ok_header(reply), buf, pace=state.charge(block))
            # The port is busy until the block has left, not until the kernel took it.
            gbps = self.ctx.config.egress_gbps
            rate = gbps * 1e9 / 8 if gbps else None
            await conn.wait_sent(MAX_UNSENT_BYTES, rate, conn.stall_timeout_s)
            self.bytes_out += len(buf)

    async def _peer(self, node: int) -> Connection:
        """The pooled connection to a peer (opened once, reopened if it broke)."""
        lock = self._pool_locks.setdefault(node, asyncio.Lock())
        async with lock:
            conn = self._pool.get(node)
            if conn is None or conn.closed:
                conn = await self.ctx.dial(node)
                self._pool[node] = conn
            return conn

    async def fetch(
        self, name: str, block: int, src: int, tier: LandingTier, step: float, wait_s: float
    ) -> tuple[memoryview, RunningChecksum]:
        """Read one block from a peer straight into its tier buffer (not verified yet; its
        checksum taken as it arrived, as far as the reads allowed)."""
        state = self.store.model(name)
        info = state.block(block)
        target = self.store.target_buffer(name, block, tier)
        conn = await self._peer(src)
        digest = state.manifest.digest  # a peer of another version sends nothing
        ask = GetBlockOp(model=name, block=block, step=step, wait_s=wait_s, digest=digest)
        running = RunningChecksum()
        try:
            await conn.request(ask.to_json(), sink=lambda _h: target, on_chunk=running.update)
        except ConnectionClosed:
            conn.close()
            raise
        self.bytes_in += info.size_bytes
        return target, running

    # ---- multicast ---------------------------------------------------------------

    async def op_multicast(
        self, op: MulticastOp, conn: Connection, p: memoryview
    ) -> MulticastReply:
        """Start this node's part of a plan: pull `recv` in order; sends are served on demand."""
        self.store.model(op.model)
        recv = sorted(op.recv)
        if op.tier == "gpu":  # the engine and its runner ready while the first block travels
            self.ctx.spawn(asyncio.to_thread(self._prepare_device, op.model))
        self.ctx.inflight.track(op.model, self.ctx.spawn(self._receive_all(op, recv)))
        return MulticastReply(mc_id=op.mc_id, num_recv=len(recv))

    def _prepare_device(self, model: str) -> None:
        """Import the engine, choose its device seam (blocks then land in pinned memory) and
        make the model's runner (its KV cache allocated: λScale §5 pre-allocates GPU memory
        before the blocks come), so the first block to land is taken in at once: made when
        it landed, the runner delayed its arrival (emulated §6.1: 0.5-1.2 s real, up to 0.03
        emulated s at D = 40)."""
        import_engine(self.ctx.config.engine.compile_decode)
        self.store.device.runner(self.store.model(model))

    async def _receive_all(self, op: MulticastOp, recv: list[tuple[int, int, int]]) -> None:
        """Pull `recv` in plan order, pipelined: block i is verified and taken into its tier
        (off the event loop) while block i+1 travels, so the ingress link does not idle
        for a checksum or a runner's intake, and this node's own sends are not held up by
        them. One block is in that stage at a time, and blocks land in plan order."""
        landing: asyncio.Task | None = None
        try:
            for step, block, src in recv:
                if self.store.model(op.model).event(block).is_set():
                    continue
                first: tuple[memoryview, RunningChecksum] | Exception
                try:
                    first = await self.fetch(op.model, block, src, op.tier, step, op.wait_s)
                except (
                    SurgeError,
                    TimeoutError,
                    ConnectionClosed,
                    AuthError,
                    OSError,
                    RemoteError,
                ) as e:
                    first = e
                if landing is not None:
                    await landing
                landing = asyncio.create_task(
                    self._receive_one(
                        op.mc_id, op.model, op.tier, step, block, src, op.wait_s, first=first
                    )
                )
            if landing is not None:
                await landing
        finally:
            if landing is not None and not landing.done():
                landing.cancel()
        await self.ctx.emit(
            ReceiveDone(node=self.ctx.node, t=time.time(), mc_id=op.mc_id, model=op.model)
        )

    async def _receive_one(
        self,
        mc: str,
        name: str,
        tier: LandingTier,
        step: float,
        block: int,
        src: int,
        wait_s: float,
        first: tuple[memoryview, RunningChecksum] | Exception | None = None,
    ) -> bool:
        """Pull one block (or take `first`, the outcome of a fetch already made), verify
        it, land it; pull again on a bad checksum; report a pull that cannot complete."""
        if first is None and self.store.model(name).event(block).is_set():
            return True
        node, reason = self.ctx.node, ""
        info = self.store.model(name).block(block)
        for attempt in range(MAX_PULL_ATTEMPTS):
            try:
                if attempt == 0 and isinstance(first, Exception):
                    raise first
                if attempt == 0 and first is not None:
                    buf, running = first
                else:
                    buf, running = await self.fetch(name, block, src, tier, step, wait_s)
                if running.num_bytes == len(buf):  # summed as it arrived: nothing left
                    verify_block(info, buf, running)
                else:  # crc32 releases the GIL: the loop keeps moving bytes meanwhile
                    await asyncio.to_thread(verify_block, info, buf, running)
            except SurgeError as e:  # checksum mismatch: pull again
                reason = str(e)
                log.warning("node %d: %s", node, e)
                await self.ctx.emit(
                    BlockCorrupt(
                        node=node, t=time.time(), mc_id=mc, model=name, block=block, src=src
                    )
                )
                continue
            except (TimeoutError, ConnectionClosed, AuthError, OSError, RemoteError) as e:
                reason = f"{type(e).__name__}: {e}"
                break
            await self.store.landed(name, block, tier, buf, mc_id=mc, src=src, step=step)
            return True
        state = self.store.models.get(name)
        if tier == "host" and state is not None and not state.event(block).is_set():
            # The segment the pulls wrote holds no verified block: `status` must not list it
            # as a host copy (a warm start reads a host copy unchecked).
            self.store.host_cache.evict(name, block)
        await self.ctx.emit(
            PullFailed(
                node=node, t=time.time(), mc_id=mc, model=name, block=block, src=src, reason=reason
            )
        )
        return False

    async def op_pull_from(self, op: PullFromOp, conn: Connection, p: memoryview) -> Ack:
        """The controller re-planned a failed delivery: pull `block` from `src` now."""
        self.store.model(op.model).block(op.block)
        pull = self._receive_one(op.mc_id, op.model, op.tier, op.step, op.block, op.src, op.wait_s)
        self.ctx.inflight.track(op.model, self.ctx.spawn(pull))
        return Ack()


GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")
"""Kernel device nodes through which a CUDA device is reached (NVIDIA's driver, WSL's, and
ROCm's, which torch also calls cuda): with none of them, `torch.cuda.is_available()` is
False, so an `auto` device is the CPU."""


def _shares_device(setting: str) -> bool:
    """Whether host mates can open this agent's device memory (`devmem.shares_device`).
    Torch (~2 s of CPU to import) is imported only where a GPU may be: an agent that only
    moves bytes (`preload_engine` off) on a machine with no GPU answers its hello without it,
    as it did before mates shared device copies (8c934c3 imported torch in every agent)."""
    if setting == "fake":
        return True
    if setting == "cpu" or (setting == "auto" and not any(map(os.path.exists, GPU_DEVICE_NODES))):
        return False
    from surge.engine.devmem import shares_device  # imports torch: run in a thread

    return shares_device(setting)
