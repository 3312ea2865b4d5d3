"""What a node holds: its models' manifests and blocks in the host, gpu and disk tiers.

What flows in: manifests (`register`, once the agent decided what a register of another
version does: `NodeAgent.op_register`), `load`, `evict` and `checksums` ops, and verified
blocks handed over by the data path (`landed`). What flows out: `arrival` events once a
block is usable in its tier, and buffers of held blocks (`buffer_of`) for peers. The host
tier is shared memory (`tiers.HostCache`, pinned where the device copies); the gpu tier is
each block's bytes on the device (`ModelState.device_blocks`, `model_state.py`) and the
engine's runner over them. A block reaches the device through the device tier
(`device_tier.py`), and it is announced in the gpu tier only once its copy there completed.
A load reads each block from its source at that source's pace through `block_reads.py`.
Owned by the node agent (`runtime/node/agent.py`).
"""

import asyncio
import logging
import time
from typing import Any

from surge.emulation import block_charges
from surge.errors import SurgeError
from surge.model.manifest import BlockInfo, Manifest, block_checksum, read_manifest
from surge.runtime.node.block_reads import BlockReads, bucket, in_thread
from surge.runtime.node.context import Handlers, NodeContext
from surge.runtime.node.device_tier import DeviceTier
from surge.runtime.node.model_state import ModelState
from surge.runtime.node.tiers import DiskTier, HostCache, RemoteRegistry, check_shm_room
from surge.runtime.protocol import (
    Ack,
    BlockArrived,
    ChecksumsOp,
    ChecksumsReply,
    EvictOp,
    LandingTier,
    LoadOp,
    LoadReply,
    ModelHolding,
    RegisterOp,
    RegisterReply,
    Source,
)
from surge.runtime.transport import Connection

log = logging.getLogger(__name__)


class AgentStore:
    """The tiers of one node and the ops that fill and empty them."""

    def __init__(self, ctx: NodeContext, memory: Any = None) -> None:
        self.ctx = ctx
        config = ctx.config
        self.host_cache = HostCache(config.cluster_id, config.node)
        self.device = DeviceTier(ctx, self.host_cache, memory)
        """The gpu tier's device side: the engine's device seam, blocks copied to it."""
        self.disk = DiskTier(config.disk_dir, bucket(config.disk_gbps))
        self.remote = (
            RemoteRegistry(config.remote_dir, bucket(config.remote_gbps))
            if config.remote_dir
            else None
        )
        self.reads = BlockReads(ctx, self.host_cache, self.disk, self.remote, self.model)
        """A load's block reads from their source, each at its tier's pace."""
        self.models: dict[str, ModelState] = {}
        self.host_evictions: dict[str, int] = {}
        """Per model, how many host evictions it has had: a host load that sees the count
        change stops, so a deleted model's copy in flight leaves no segment behind."""

    def handlers(self) -> Handlers:
        return {
            LoadOp: self.op_load,
            EvictOp: self.op_evict,
            ChecksumsOp: self.op_checksums,
        }

    def close(self) -> None:
        for state in self.models.values():  # drop the gpu tier's views before the segments
            state.gpu_buffers.clear()
            state.device_blocks.clear()
            state.runner = None
        self.host_cache.close()
        self.device.close()

    def drop(self, name: str) -> None:
        """Forget a model (`drop_model`, once its ops here have ended): every copy in every
        tier goes, with its manifest; a host load still running stops."""
        state = self.models.pop(name, None)
        if state is None:
            return
        state.dropped.set()
        for block in self.host_cache.blocks(name):
            self.host_cache.evict(name, block)
        self.host_evictions[name] = self.host_evictions.get(name, 0) + 1
        self.disk.drop(name)
        state.gpu_buffers.clear()  # the device memory goes with the last reference
        state.device_blocks.clear()
        state.runner = None
        for present in state.present.values():
            present.clear()

    # ---- what is held -----------------------------------------------------------

    def model(self, name: str) -> ModelState:
        state = self.models.get(name)
        if state is None:
            raise SurgeError(
                f"model {name!r} is not registered on node {self.ctx.node} (send register first)"
            )
        return state

    def holdings(self) -> dict[str, ModelHolding]:
        return {
            name: ModelHolding(
                host=tuple(self.host_cache.blocks(name)),
                gpu=tuple(sorted(st.device_blocks)),
                disk=tuple(self.disk.blocks(name, st.manifest)),
                digest=st.manifest.digest,
            )
            for name, st in self.models.items()
        }

    def buffer_of(self, name: str, block: int) -> memoryview | None:
        """A held copy of a block, host tier first."""
        buf = self.host_cache.get(name, block)
        if buf is not None:
            return buf[: self.model(name).manifest.blocks[block].size_bytes]
        gpu = self.model(name).gpu_buffers.get(block)
        return None if gpu is None else memoryview(gpu)

    def target_buffer(self, name: str, block: int, tier: LandingTier) -> memoryview:
        """Where an arriving block goes, by tier (pre-allocated, written in place)."""
        info = self.model(name).block(block)
        if tier == "host":
            return self.host_cache.allocate(name, info)
        if self.device.chosen is not None:  # pinned where the device copies from it
            return self.device.chosen.host_buffer(info.size_bytes)
        return memoryview(bytearray(info.size_bytes))

    async def landed(
        self,
        name: str,
        block: int,
        tier: LandingTier,
        buf: memoryview,
        *,
        source: Source | None = None,
        mc_id: str | None = None,
        src: int | None = None,
        step: float | None = None,
        adopt: bool = True,
    ) -> None:
        """A verified block is in `buf`: make it usable in its tier and announce it. In the
        gpu tier that is once its copy to the device completed; `adopt`: `buf` is the gpu
        tier's own (received into it), else borrowed (the host tier's) and always copied."""
        state = self.model(name)
        landed_t = time.time()
        if tier == "gpu":
            state.gpu_buffers[block] = buf
        state.event(block).set()  # peers may pull it now, while it moves to the device
        if tier == "gpu":
            await asyncio.to_thread(self.device.to_device, state, block, buf, adopt)
        elif self.host_cache.pinner is not None:
            await asyncio.to_thread(self.host_cache.pin, name, block)
        # The event goes out once the block is usable in its tier; `t` is when it landed.
        await self.ctx.emit(
            BlockArrived(
                node=self.ctx.node,
                t=landed_t,
                model=name,
                block=block,
                tier=tier,
                source=source,
                mc_id=mc_id,
                src=src,
                step=step,
                digest=state.manifest.digest,
            )
        )

    # ---- ops ---------------------------------------------------------------------

    def manifest_for(self, op: RegisterOp) -> Manifest:
        """The manifest a `register` names: sent inline, or read from the registry."""
        if op.manifest is not None:
            return op.manifest
        if self.remote is None:
            raise SurgeError(
                f"no manifest given for {op.model!r} and node {self.ctx.node} has no "
                "registry (send the manifest, or start the agent with --remote-dir)"
            )
        return read_manifest(self.remote.store_dir(op.model))

    def register(self, name: str, manifest: Manifest) -> RegisterReply:
        """Learn a model's manifest (the agent decides first what a `register` of another
        version does: `NodeAgent.op_register`, `policy.versions`). Disk-tier files of another
        version (left by an earlier run of this node) go: the disk tier is keyed by name."""
        if name not in self.models:
            self.disk.claim(name, manifest.digest)
            # emulated: each block moves in one emulated block's time, whatever its bytes
            charges = block_charges(manifest) if self.ctx.config.emulate else ()
            self.models[name] = ModelState(manifest, charges)
        return RegisterReply(model=name, num_blocks=manifest.num_blocks)

    async def op_load(self, op: LoadOp, conn: Connection, p: memoryview) -> LoadReply:
        """Bring blocks from disk, the host tier or the registry into a tier."""
        state = self.model(op.model)
        infos = [state.block(b) for b in op.blocks]  # every index checked before any read
        t0 = time.perf_counter()
        # Fetching never waits for the engine: each block is handed to a landing chain
        # (in order) and the next read starts at once, so a cold node streams its blocks in
        # while its engine initialises, and each block is usable the moment the engine
        # takes it (ParaServe §5, worker-level overlap).
        landing: asyncio.Task | None = None

        async def land_after(
            prev: asyncio.Task | None, block: int, buf: memoryview, adopt: bool
        ) -> None:
            if prev is not None:
                await prev
            await self.landed(op.model, block, tier, buf, source=op.source, adopt=adopt)

        tier = op.tier
        made: list[int] = []  # host segments this load created (removed if it fails)
        keep = op.keep_host and self._room_to_keep(op.model, infos)
        if tier == "host":
            missing = [i for i in infos if self.host_cache.get(op.model, i.index) is None]
            check_shm_room(op.model, missing, self.ctx.config.fault_shm_free_bytes)
        evictions = self.host_evictions.get(op.model, 0)
        read, stop = self.reads.read, state.dropped
        try:
            for info in infos:
                evicted = self.host_evictions.get(op.model, 0) != evictions
                if tier == "host" and evicted:
                    raise SurgeError(f"the host copy of {op.model} was evicted while it loaded")
                keep = keep and not evicted  # the rest goes straight to the gpu tier
                if (tier == "host" or keep) and self.host_cache.get(op.model, info.index) is None:
                    made.append(info.index)
                if tier == "disk":
                    buf = memoryview(bytearray(info.size_bytes))
                    await in_thread(read, op.source, op.model, info, buf, "critical", stop)
                    await in_thread(self.disk.write, op.model, info, buf)
                    continue
                adopt = not (tier == "gpu" and op.source == "host")
                if keep:  # ServerlessLLM §4: through the host tier, which keeps it (LRU)
                    buf = self.target_buffer(op.model, info.index, "host")
                    await in_thread(read, op.source, op.model, info, buf, op.priority, stop)
                    await self.landed(op.model, info.index, "host", buf, source=op.source)
                    adopt = False  # the gpu tier copies it: the host copy stays its own
                elif adopt:
                    buf = self.target_buffer(op.model, info.index, tier)
                    await in_thread(read, op.source, op.model, info, buf, op.priority, stop)
                else:  # a warm start: the device copies straight from the (pinned) host copy
                    buf = self.reads.host_copy(op.model, info)
                    cost = int(info.size_bytes * state.charge(info.index))
                    await in_thread(self.reads.pace_pcie, cost, stop)
                landing = asyncio.get_running_loop().create_task(
                    land_after(landing, info.index, buf, adopt)
                )
            fetched_s = time.perf_counter() - t0
            if landing is not None:
                await landing
            if tier == "host" and self.host_evictions.get(op.model, 0) != evictions:
                raise SurgeError(f"the host copy of {op.model} was evicted while it loaded")
        except BaseException:
            if landing is not None:
                landing.cancel()
            for block in made:  # a failed copy leaves no shared memory behind
                self.host_cache.evict(op.model, block)
                if block in state.present and self.buffer_of(op.model, block) is None:
                    state.present[block].clear()
            raise
        return LoadReply(seconds=time.perf_counter() - t0, fetch_seconds=fetched_s)

    def _room_to_keep(self, name: str, infos: list[BlockInfo]) -> bool:
        """Whether shared memory has room for the blocks' host copy that a gpu load or an
        eviction would keep (`keep_host`); without it nothing is kept (logged)."""
        missing = [i for i in infos if self.host_cache.get(name, i.index) is None]
        try:
            check_shm_room(name, missing, self.ctx.config.fault_shm_free_bytes)
        except SurgeError as e:
            log.warning("node %d keeps no host copy of %s: %s", self.ctx.node, name, e)
            return False
        return True

    async def op_evict(self, op: EvictOp, conn: Connection, p: memoryview) -> Ack:
        state = self.model(op.model)
        if op.keep_host:
            await self._keep_in_host(op.model, state, op.blocks)
        for block in op.blocks:
            info = state.block(block)
            if op.tier == "host":
                self.host_cache.evict(op.model, block)
                self.host_evictions[op.model] = self.host_evictions.get(op.model, 0) + 1
            elif op.tier == "disk":
                self.disk.evict(op.model, info)
            else:
                state.gpu_buffers.pop(block, None)
                state.device_blocks.pop(block, None)
                if not state.device_blocks:
                    state.runner = None
            if self.buffer_of(op.model, block) is None and block in state.present:
                state.present[block].clear()
        return Ack()

    async def _keep_in_host(self, name: str, state: ModelState, blocks: tuple[int, ...]) -> None:
        """FlexPipe §7: gpu-tier blocks not in the host tier are copied there (from the
        buffer each landed in, else from the device) and announced, before the eviction
        frees them; without room in shared memory none is kept."""
        infos = [
            state.block(b)
            for b in blocks
            if b in state.device_blocks and self.host_cache.get(name, b) is None
        ]
        if not self._room_to_keep(name, infos):
            return
        for info in infos:
            held = state.gpu_buffers.get(info.index)
            if held is None:  # a device copy only: read it back
                data = state.device_blocks[info.index]
                held = memoryview(data.cpu().numpy()).cast("B")
            buf = self.host_cache.allocate(name, info)
            buf[: info.size_bytes] = held[: info.size_bytes]
            await self.landed(name, info.index, "host", buf)

    async def op_checksums(
        self, op: ChecksumsOp, conn: Connection, p: memoryview
    ) -> ChecksumsReply:
        """crc32 of every block held in host or gpu memory, recomputed now."""
        out = {}
        for block in range(self.model(op.model).manifest.num_blocks):
            buf = self.buffer_of(op.model, block)
            if buf is not None:
                out[block] = block_checksum(buf)
        return ChecksumsReply(checksums=out)
