"""One device copy shared by the agents of a host group (the NVLink analogue).

What flows: `export_device` from a host mate in, the IPC handles of this agent's gpu-tier
arenas out (`surge.engine.devmem`); `open_mate_copy` from the controller in, the mate's
handles opened into this agent's gpu tier (no copy on the same GPU; one device-to-device
copy from another GPU of the machine), each block announced like any arrival (tier gpu,
source `mate`, `src` the mate), only once its bytes are usable. Only host mates share:
IPC handles mean nothing on another machine. Composed into `NodeAgent` with the node's
`NodeContext` and `AgentStore` (ServerlessLLM's and Dynamo's one-copy-per-host idea;
BlitzScale §5.1's NVLink groups).
"""

import asyncio
import time

from surge.errors import SurgeError
from surge.policy.versions import refuse_as_source
from surge.runtime.node.context import Handlers, NodeContext
from surge.runtime.node.model_state import ModelState
from surge.runtime.node.store import AgentStore
from surge.runtime.protocol import (
    BlockArrived,
    DeviceHandlesReply,
    ExportDeviceOp,
    LoadReply,
    OpenMateCopyOp,
)
from surge.runtime.transport import Connection


class AgentDeviceShare:
    """Exports this agent's device copy to its host mates, and opens theirs."""

    def __init__(self, ctx: NodeContext, store: AgentStore) -> None:
        self.ctx, self.store = ctx, store

    def handlers(self) -> Handlers:
        return {ExportDeviceOp: self.op_export_device, OpenMateCopyOp: self.op_open_mate_copy}

    def _check_mate(self, node: int, what: str) -> None:
        if node not in self.ctx.config.host_mates:
            raise SurgeError(
                f"node {node} is not a host mate of node {self.ctx.node} (mates: "
                f"{list(self.ctx.config.host_mates)}): {what} needs one machine"
            )

    async def op_export_device(
        self, op: ExportDeviceOp, conn: Connection, p: memoryview
    ) -> DeviceHandlesReply:
        peer = conn.peer.removeprefix("node-")
        self._check_mate(int(peer) if peer.isdigit() else -1, "sharing a device copy")
        state = self.store.model(op.model)
        refused = refuse_as_source(op.model, self.ctx.node, state.manifest.digest, op.digest)
        if refused is not None:
            raise SurgeError(refused)
        missing = [b for b in op.blocks if b not in state.device_blocks]
        for b in op.blocks:
            state.block(b)
        if missing:
            raise SurgeError(f"node {self.ctx.node} holds blocks {missing} on no device")
        memory = await asyncio.to_thread(self.store.device.memory)
        if not memory.can_share:
            raise SurgeError(f"node {self.ctx.node}'s device ({memory.device}) cannot share memory")
        handles = tuple(memory.export_ipc(state.device_blocks[b]) for b in op.blocks)
        return DeviceHandlesReply(handles=handles)

    async def op_open_mate_copy(
        self, op: OpenMateCopyOp, conn: Connection, p: memoryview
    ) -> LoadReply:
        self._check_mate(op.mate, "opening a mate's device copy")
        state = self.store.model(op.model)
        for b in op.blocks:
            state.block(b)
        t0 = time.perf_counter()
        mate = await self.ctx.dial(op.mate)
        ask = ExportDeviceOp(model=op.model, blocks=op.blocks, digest=state.manifest.digest)
        try:
            header, _ = await mate.request(ask.to_json())
        finally:
            mate.close()
        reply = DeviceHandlesReply.from_json(header)
        fetched_s = time.perf_counter() - t0
        for block, handle in zip(op.blocks, reply.handles, strict=True):
            await asyncio.to_thread(self._open, state, block, handle)
            await self.ctx.emit(
                BlockArrived(
                    node=self.ctx.node,
                    t=time.time(),
                    model=op.model,
                    block=block,
                    tier="gpu",
                    source="mate",
                    src=op.mate,
                    digest=state.manifest.digest,
                )
            )
        return LoadReply(seconds=time.perf_counter() - t0, fetch_seconds=fetched_s)

    def _open(self, state: ModelState, block: int, handle) -> None:
        """Open one handle (a worker thread), wait for its copy if it needed one, take it in."""
        info = state.block(block)
        if handle.num_bytes != info.size_bytes:
            raise SurgeError(
                f"the mate's copy of block {block} has {handle.num_bytes} bytes, "
                f"expected {info.size_bytes}"
            )
        copy = self.store.device.memory().open_ipc(handle)
        copy.event.wait()
        self.store.device.take_in(state, block, copy.data)
