"""A load's block reads: one block from its source into a buffer, at its tier's pace.

In: a `LoadOp`'s source (`host`: this node's own host copy; `disk`; `remote`: the
registry), the block, the buffer it goes to, its priority and the model's stop event (set
once the model is dropped). Out: the block's bytes in the buffer, after the time its
source's cap charges for them: this node's PCIe cap for a host copy (host -> GPU), the
disk's, the registry's — and, for a background fetch, the NIC behind inference packets
(ParaServe §4.2). Each byte costs the block's charge (`ModelState.charge`: one emulated
block's time under emulation). A read gives up at its next chunk once the model is dropped
(`LoadAborted`). Reads run in worker threads (`in_thread`). Owned by the node's
`AgentStore` (`store.py`), which holds the tiers they read from.
"""

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from surge.errors import SurgeError
from surge.model.manifest import BlockInfo
from surge.policy.paraserve.prefetch import Priority
from surge.runtime.node.context import NodeContext
from surge.runtime.node.model_state import ModelState
from surge.runtime.node.tiers import DiskTier, HostCache, LoadAborted, RemoteRegistry
from surge.runtime.protocol import Source
from surge.runtime.token_bucket import TokenBucket, gbps_to_bytes_per_s

T = TypeVar("T")


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """`asyncio.to_thread`, except that a cancelled caller waits for the thread to end (a
    dropped model's read ends at its next chunk), so a load's clean-up never races a read
    or write still under way and nothing of a dropped model is written after it."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        if not fut.cancelled():
            fut.exception()  # retrieved: the caller is gone, nobody else wants it
        raise


def bucket(gbps: float | None) -> TokenBucket:
    """A read cap of `gbps` (None: unlimited)."""
    return TokenBucket(gbps_to_bytes_per_s(gbps) if gbps else None)


class BlockReads:
    """Reads of one node's blocks from their sources (worker threads)."""

    def __init__(
        self,
        ctx: NodeContext,
        host_cache: HostCache,
        disk: DiskTier,
        remote: RemoteRegistry | None,
        model: Callable[[str], ModelState],
    ) -> None:
        self.ctx = ctx
        self.host_cache = host_cache
        self.disk = disk
        self.remote = remote
        self.model = model
        """`AgentStore.model`: a registered model's state (its blocks' charges)."""
        self.pcie = bucket(ctx.config.pcie_gbps)
        """Paces a load from this node's host copy into its gpu tier (host -> GPU)."""

    def read(
        self,
        source: Source,
        name: str,
        info: BlockInfo,
        buf: memoryview,
        priority: Priority = "critical",
        stop: threading.Event | None = None,
    ) -> None:
        """Read one block of `name` from `source` into `buf` (a worker thread); gives up at
        its next chunk once `stop` is set (the model was dropped: `LoadAborted`). Each byte
        costs the block's charge on the paced tier (`ModelState.charge`: emulation)."""
        charge = self.model(name).charge(info.index)
        if source == "host":  # this node's own host copy into another tier
            buf[: info.size_bytes] = self.host_copy(name, info)
            self.pace_pcie(int(info.size_bytes * charge), stop)
        elif source == "disk":
            self.disk.read_into(name, info, buf, stop, charge=charge)
        else:
            if self.remote is None:
                raise SurgeError(
                    f"node {self.ctx.node} has no registry configured (start it with --remote-dir)"
                )
            # ParaServe §4.2: a background fetch shares the NIC with inference packets,
            # which go first (a critical one is paced by the registry's cap alone)
            nic = self.ctx.ingress if priority == "background" else None
            self.remote.read_into(name, info, buf, nic, stop, charge=charge)

    def pace_pcie(self, num_bytes: int, stop: threading.Event | None = None) -> None:
        """A host -> GPU copy's time on this node's PCIe cap (a worker thread); gives up
        once `stop` is set (the model was dropped: `LoadAborted`)."""
        self.pcie.consume_blocking(num_bytes, stop=stop)
        if stop is not None and stop.is_set():
            raise LoadAborted("a copy to the gpu tier stopped: its model was dropped")

    def host_copy(self, name: str, info: BlockInfo) -> memoryview:
        """This node's host copy of a block (its bytes only)."""
        held = self.host_cache.get(name, info.index)
        if held is None:
            raise SurgeError(f"node {self.ctx.node} holds no host copy of block {info.index}")
        return held[: info.size_bytes]
