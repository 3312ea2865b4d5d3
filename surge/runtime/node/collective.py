"""How an agent takes part in a collective broadcast: the NCCL baseline's gloo group.

In: `group_broadcast` (`protocol/group_ops.py`) from the controller's `GroupExecutor`
(`runtime/collective.py`). The root (rank 0, a source holding every block) binds the
group's rendezvous on its own address and answers where; each target joins it. Every member
then forms a `torch.distributed` gloo group (`node/gloo_group.py`) — the group's creation,
timed: the paper's per-scale-out set-up cost, measured; under emulation a member moves no
block before `op.setup_floor_s` has passed since its op — and the root sends the model's
blocks in order (gloo's broadcast collective, one per block, or NCCL's ring order over
gloo's send/recv: `op.algorithm`) from its held buffers straight into each target's
preallocated tier buffers. A target checks each block against the manifest and
lands it like a pulled one (`arrival` with the multicast's id), so the controller's loading
state machine does not know how the bytes came. Out: arrivals; for every block a target
could not receive (a member gone, a timeout), a `pull_failed` naming the root, so the
controller's re-plan pulls it from a live holder over surge's own transport; and a
`group_done` with the times, once the group is destroyed. A group given up (its model
dropped here while it moves blocks) is destroyed in a worker thread too: the destruction
waits for its pending operations' timeouts, which must not hold the event loop.

Composed into `NodeAgent` (`runtime/node/agent.py`) with the node's `NodeContext` and its
`AgentStore`.
"""

import asyncio
import logging
import time
from datetime import timedelta

from surge.errors import SurgeError
from surge.model.manifest import verify_block
from surge.policy.versions import refuse_as_source
from surge.runtime.node.context import Handlers, NodeContext
from surge.runtime.node.gloo_group import GlooGroup, bind_rendezvous
from surge.runtime.node.store import AgentStore
from surge.runtime.protocol import GroupBroadcastOp, GroupDone, GroupReply, PullFailed
from surge.runtime.transport import Connection

log = logging.getLogger(__name__)


class AgentCollective:
    """This node's side of gloo group broadcasts."""

    def __init__(self, ctx: NodeContext, store: AgentStore) -> None:
        self.ctx, self.store = ctx, store

    def handlers(self) -> Handlers:
        return {GroupBroadcastOp: self.op_group_broadcast}

    def _refuse_unless_shaped(self) -> None:
        """A gloo group's sockets are torch's: plain TCP, outside the agent's TLS and its
        token buckets. Refuse where that would leak bytes or skip the link caps."""
        c = self.ctx.config
        if self.ctx.tls is not None:
            raise SurgeError(
                "a gloo group's bytes are plain TCP and this cluster uses TLS: use the "
                "`blocks` multicast transport"
            )
        if c.pace_links and (c.egress_gbps is not None or c.ingress_gbps is not None):
            raise SurgeError(
                "a gloo group's sockets bypass this agent's link pacing (token buckets): "
                "run it on a cluster whose links the kernel shapes (--cluster netns) or "
                "without link caps"
            )

    async def op_group_broadcast(
        self, op: GroupBroadcastOp, conn: Connection, p: memoryview
    ) -> GroupReply:
        """Bind (root) or join (target) the group, answer, and run the broadcast in a task."""
        self._refuse_unless_shaped()
        state = self.store.model(op.model)
        for b in op.blocks:
            state.block(b)
        if op.rank > 0 and op.digest:  # a root of another version is no source of this one
            refused = refuse_as_source(op.model, op.root, op.digest, state.manifest.digest)
            if refused is not None:
                raise SurgeError(refused)
        if op.rank == 0 and any(self.store.buffer_of(op.model, b) is None for b in op.blocks):
            raise SurgeError(f"node {self.ctx.node} cannot be the root: it lacks blocks")
        start = time.monotonic()
        host = self.ctx.config.host
        if op.rank == 0:
            listener = bind_rendezvous(host)
            store_host, store_port = listener.getsockname()[:2]
            group = await asyncio.to_thread(
                GlooGroup.root_store, listener, op.world_size, op.init_timeout_s
            )
        else:
            store_host, store_port = op.store_host, op.store_port
            group = None  # a target connects in its task: the rendezvous may wait for the rest
        self.ctx.inflight.track(op.model, self.ctx.spawn(self._run(op, group, start)))
        digest = state.manifest.digest
        return GroupReply(store_host=store_host, store_port=store_port, digest=digest)

    async def _run(self, op: GroupBroadcastOp, group: GlooGroup | None, start: float) -> None:
        ready_t = setup_s = broadcast_s = None
        landed: set[int] = set()
        error = ""
        num_bytes = 0
        try:
            if group is None:
                group = await asyncio.to_thread(
                    GlooGroup.member_store,
                    self.ctx.config.host,
                    op.store_host,
                    op.store_port,
                    op.init_timeout_s,
                )
            await asyncio.to_thread(group.form, op.rank, op.world_size, op.init_timeout_s)
            setup_s = time.monotonic() - start
            if (pad_s := start + op.setup_floor_s - time.monotonic()) > 0:
                # Emulation: no block moves before the emulated NCCL communicator would
                # exist on this member (the CPU group forms far faster than it)
                await asyncio.sleep(pad_s)
            ready_t = time.time()
            t0 = time.monotonic()
            num_bytes = await self._move(op, group, landed)
            broadcast_s = time.monotonic() - t0
        except asyncio.CancelledError:
            # Given up (its model dropped here: `DropModelOp`, a deleted deployment). The
            # group goes down in a worker thread: left to the garbage collector, it was
            # destroyed on the event loop, which waited there for its pending operations'
            # timeouts (the agent answered nothing for 4-5 s, a missed heartbeat).
            if group is not None:
                await asyncio.to_thread(group.close, True)
            raise
        except (RuntimeError, SurgeError, OSError, ValueError) as e:
            # torch raises RuntimeError (DistBackendError, DistNetworkError) for a member
            # gone, a timeout, a refused rendezvous
            error = f"{type(e).__name__}: {e}"[:500]
            log.warning("node %d: group %s failed: %s", self.ctx.node, op.mc_id, error)
        if op.rank != 0:  # at once, before the group is torn down: the re-plan starts now
            await self._report_missing(op, landed, error)
        if group is not None:
            await asyncio.to_thread(group.close, bool(error))
        await self.ctx.emit(
            GroupDone(
                node=self.ctx.node,
                t=time.time(),
                mc_id=op.mc_id,
                model=op.model,
                rank=op.rank,
                ready_t=ready_t,
                setup_s=setup_s,
                broadcast_s=broadcast_s,
                num_bytes=num_bytes,
                error=error,
            )
        )

    async def _report_missing(self, op: GroupBroadcastOp, landed: set[int], error: str) -> None:
        """A failed pull for every block the group did not deliver here."""
        for b in op.blocks:
            if b in landed or self.store.model(op.model).event(b).is_set():
                continue
            await self.ctx.emit(
                PullFailed(
                    node=self.ctx.node,
                    t=time.time(),
                    mc_id=op.mc_id,
                    model=op.model,
                    block=b,
                    src=op.root,
                    reason=f"gloo group: {error or 'block not received'}",
                )
            )

    async def _move(self, op: GroupBroadcastOp, group: GlooGroup, landed: set[int]) -> int:
        """Every block from rank 0 (`op.algorithm`), landed in order as it completes (gloo
        moves the next ones meanwhile). Returns the bytes moved (received, or put in)."""
        name, root = op.model, op.rank == 0
        if root:
            held = [self.store.buffer_of(name, b) for b in op.blocks]
            bufs = [buf for buf in held if buf is not None]
            if len(bufs) < len(held):
                raise SurgeError(f"node {self.ctx.node} evicted a block before the broadcast")
        else:
            bufs = [self.store.target_buffer(name, b, op.tier) for b in op.blocks]
        algo, rank, size = op.algorithm, op.rank, op.world_size
        works = await asyncio.to_thread(group.start, algo, bufs, rank, size, op.timeout_s)
        wait = timedelta(seconds=op.timeout_s)
        sends = []
        for step, (b, buf, work) in enumerate(zip(op.blocks, bufs, works, strict=True), 1):
            await asyncio.to_thread(work.wait, wait)
            if (fwd := group.forward(algo, step - 1, rank, size)) is not None:
                sends.append(fwd)  # passed on before it is checked: the next rank checks too
            if root or self.store.model(name).event(b).is_set():
                continue
            await asyncio.to_thread(verify_block, self.store.model(name).block(b), buf)
            await self.store.landed(name, b, op.tier, buf, mc_id=op.mc_id, src=op.root,
                                    step=step)  # fmt: skip
            landed.add(b)
        for fwd in sends:
            await asyncio.to_thread(fwd.wait, wait)
        return sum(len(buf) for buf in bufs)
