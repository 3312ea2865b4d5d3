"""The node agent: one process per node, owning that node's tiers and serving its blocks.

What flows in: control requests from the controller (register, load, evict, multicast,
pull_from, status, checksums, generate, subscribe, shutdown) and block reads from peers
(`get_block`), all as frames on authenticated connections. What flows out: block bytes to
peers, answers, and events (block arrivals, failed pulls) to subscribers.

This file holds the agent's lifecycle, its tiers and events, and the control ops; the
block data path (multicast pulls, serving peers) is `agent_transfer.py` and model execution
(stages, local instances) is `agent_serving.py`, both mixins of `NodeAgent`.
"""

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from surge.config import EngineConfig
from surge.errors import SurgeError
from surge.model.manifest import Manifest, block_checksum
from surge.runtime.agent_serving import ServingOps
from surge.runtime.agent_transfer import EgressPort, TransferOps, import_engine
from surge.runtime.tiers import DiskTier, HostCache, RemoteRegistry
from surge.runtime.token_bucket import TokenBucket, gbps_to_bytes_per_s
from surge.runtime.transport import (
    DEFAULT_HOST,
    AuthError,
    Connection,
    ConnectionClosed,
    RemoteError,
    accept_hello,
)
from surge.wire import FrameError

log = logging.getLogger(__name__)

PARENT_CHECK_S = 1.0


@dataclass(frozen=True)
class AgentConfig:
    """Settings of one node agent."""

    node: int
    """This node's id (0..N-1 in its cluster)."""
    cluster_id: str
    """Names this cluster's shared-memory segments."""
    token: str
    """Shared secret every connection must present."""
    disk_dir: Path
    """This node's local disk tier."""
    host: str = DEFAULT_HOST
    port: int = 0
    """0 picks a free port (reported on stdout when ready)."""
    egress_gbps: float | None = None
    """Egress cap of this node's NIC (None: unlimited)."""
    ingress_gbps: float | None = None
    remote_dir: Path | None = None
    """The registry: a directory of stores, ROOT/<model>/manifest.json."""
    remote_gbps: float | None = None
    """Read cap of the registry as seen from this node."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    preload_engine: bool = True
    """Import the engine (torch) before announcing readiness, so the first block that lands
    in the gpu tier does not wait ~1.5 s for it."""
    fault_corrupt_sends: int = 0
    """Testing only: corrupt the payload of this many block sends."""


@dataclass
class ModelState:
    """What this node holds of one model."""

    manifest: Manifest
    present: dict[int, asyncio.Event] = field(default_factory=dict)
    gpu_buffers: dict[int, Any] = field(default_factory=dict)
    runner: Any = None
    """The engine's runner over the gpu-tier blocks (created on the first one)."""

    def event(self, block: int) -> asyncio.Event:
        return self.present.setdefault(block, asyncio.Event())


class NodeAgent(TransferOps, ServingOps):
    """The server side of one node."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.node = config.node
        rate = gbps_to_bytes_per_s
        self.egress = TokenBucket(rate(config.egress_gbps) if config.egress_gbps else None)
        self.ingress = TokenBucket(rate(config.ingress_gbps) if config.ingress_gbps else None)
        self.host_cache = HostCache(config.cluster_id, config.node)
        self.disk = DiskTier(config.disk_dir)
        self.remote = (
            RemoteRegistry(
                config.remote_dir,
                TokenBucket(rate(config.remote_gbps) if config.remote_gbps else None),
            )
            if config.remote_dir
            else None
        )
        self.models: dict[str, ModelState] = {}
        self.peers: dict[int, tuple[str, int]] = {}
        self._pool: dict[int, Connection] = {}
        self._pool_locks: dict[int, asyncio.Lock] = {}
        self.port_out = EgressPort()
        self.subscribers: list[Connection] = []
        self.bytes_in = 0
        self.bytes_out = 0
        self._corrupt_left = config.fault_corrupt_sends
        self._tasks: set[asyncio.Task] = set()
        self.stages: dict = {}
        self.instances: dict = {}
        self._stage_pool: dict[int, list[Connection]] = {}
        self._stop = asyncio.Event()
        self._server: socket.socket | None = None
        self.port = 0

    # ---- lifecycle ---------------------------------------------------------------

    async def start(self) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.config.host, self.config.port))
        sock.listen(128)
        sock.setblocking(False)
        self._server = sock
        self.port = sock.getsockname()[1]
        self._spawn(self._accept_loop())
        return self.port

    async def serve_forever(self) -> None:
        parent = os.getppid()
        while not self._stop.is_set():
            # No orphans: an agent whose launcher died exits by itself.
            if os.getppid() != parent:
                log.warning("node %d: launcher is gone, exiting", self.node)
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), PARENT_CHECK_S)
        await self.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        stage_conns = [c for conns in self._stage_pool.values() for c in conns]
        for conn in [*self._pool.values(), *self.subscribers, *stage_conns]:
            conn.close()
        for task in list(self._tasks):
            task.cancel()
        self.host_cache.close()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._server is not None
        while True:
            client, _ = await loop.sock_accept(self._server)
            self._spawn(self._handle(Connection(client, self.egress, self.ingress)))

    async def _handle(self, conn: Connection) -> None:
        """Serve one connection until it closes; a bad peer never takes the agent down."""
        try:
            who = await accept_hello(conn, self.config.token, f"node-{self.node}")
            conn.peer = who
            while True:
                header, payload = await conn.recv()
                if header.get("op") == "subscribe":
                    self.subscribers.append(conn)
                    await conn.send({"ok": True, "op": "subscribed"})
                    return  # the connection now belongs to the event stream
                await self._dispatch(conn, header, payload)
        except (TimeoutError, ConnectionClosed, AuthError, FrameError, OSError) as e:
            log.info("node %d: connection from %s ended: %s", self.node, conn.peer, e)
            if conn not in self.subscribers:
                conn.close()

    async def _dispatch(self, conn: Connection, header: dict, payload: memoryview) -> None:
        op = header.get("op")
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            await conn.send({"ok": False, "error": f"unknown op {op!r}"})
            return
        try:
            result = await handler(conn, header, payload)
        except (SurgeError, KeyError, ValueError, RemoteError) as e:
            await conn.send({"ok": False, "error": f"{op}: {e}"})
            return
        if result is not None:  # handlers that stream their own answer return None
            await conn.send({"ok": True, **result})

    # ---- events ------------------------------------------------------------------

    async def emit(self, event: dict[str, Any]) -> None:
        frame = {"kind": "event", "node": self.node, "t": time.time(), **event}
        for conn in list(self.subscribers):
            try:
                async with conn.lock:
                    await conn.send(frame)
            except (ConnectionClosed, OSError):
                self.subscribers.remove(conn)
                conn.close()

    # ---- tiers -------------------------------------------------------------------

    def model(self, name: str) -> ModelState:
        if name not in self.models:
            raise KeyError(f"model {name!r} is not registered on node {self.node}")
        return self.models[name]

    def buffer_of(self, name: str, block: int) -> memoryview | None:
        """A held copy of a block, host tier first."""
        buf = self.host_cache.get(name, block)
        if buf is not None:
            return buf[: self.model(name).manifest.blocks[block].size_bytes]
        gpu = self.model(name).gpu_buffers.get(block)
        return None if gpu is None else memoryview(gpu)

    def target_buffer(self, name: str, block: int, tier: str) -> memoryview:
        """Where an arriving block goes, by tier (pre-allocated, written in place)."""
        info = self.model(name).manifest.blocks[block]
        if tier == "host":
            return self.host_cache.allocate(name, info)
        if tier == "gpu":
            return memoryview(bytearray(info.size_bytes))
        raise ValueError(f"blocks cannot land in tier {tier!r} (host or gpu)")

    async def landed(self, name: str, block: int, tier: str, buf: memoryview, **extra: Any) -> None:
        """A verified block is in `buf`: make it usable in its tier and announce it."""
        state = self.model(name)
        landed_t = time.time()
        if tier == "gpu":
            state.gpu_buffers[block] = buf
        state.event(block).set()  # peers may pull it now, while the runner takes it in
        if tier == "gpu":
            await asyncio.to_thread(self._add_to_runner, state, block, buf)
        # The event goes out once the block is usable in its tier; `t` is when it landed.
        await self.emit(
            {"type": "arrival", "model": name, "block": block, "tier": tier, "t": landed_t, **extra}
        )

    def _add_to_runner(self, state: ModelState, block: int, buf: memoryview) -> None:
        if state.runner is None:
            from surge.engine.runner import ModelRunner

            state.runner = ModelRunner(state.manifest, self.config.engine)
        state.runner.add_block(block, buf, verify=False)  # verified on arrival

    # ---- control ops -------------------------------------------------------------

    async def op_status(self, conn: Connection, h: dict, p: memoryview) -> dict:
        models = {}
        for name, st in self.models.items():
            models[name] = {
                "host": self.host_cache.blocks(name),
                "gpu": sorted(st.gpu_buffers),
                "disk": self.disk.blocks(name, st.manifest),
            }
        return {
            "node": self.node,
            "port": self.port,
            "models": models,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "peers": sorted(self.peers),
        }

    async def op_register(self, conn: Connection, h: dict, p: memoryview) -> dict:
        """Learn a model's manifest (sent inline, or read from the registry)."""
        name = h["model"]
        if h.get("manifest") is not None:
            manifest = Manifest.from_json(h["manifest"])
        elif self.remote is not None:
            from surge.model.manifest import read_manifest

            manifest = read_manifest(self.remote.store_dir(name))
        else:
            raise SurgeError(f"no manifest given for {name!r} and no registry configured")
        if name not in self.models:
            self.models[name] = ModelState(manifest)
        return {"model": name, "num_blocks": manifest.num_blocks}

    async def op_set_peers(self, conn: Connection, h: dict, p: memoryview) -> dict:
        """Learn peer addresses and pre-open a connection to each (BlitzScale §5.3 pool)."""
        self.peers = {int(k): (v[0], int(v[1])) for k, v in h["peers"].items()}
        if h.get("preconnect", True):
            await asyncio.gather(
                *(self._peer(n) for n in self.peers if n != self.node), return_exceptions=True
            )
        return {"peers": sorted(self.peers)}

    async def op_load(self, conn: Connection, h: dict, p: memoryview) -> dict:
        """Bring blocks from disk or the registry into a tier (host, gpu or disk)."""
        name, tier, source = h["model"], h.get("tier", "host"), h.get("source", "disk")
        state = self.model(name)
        t0 = time.perf_counter()
        # Fetching never waits for the engine: each block is handed to a landing chain
        # (in order) and the next read starts at once, so a cold node streams its blocks in
        # while its engine initialises, and each block is usable the moment the engine
        # takes it (ParaServe §5, worker-level overlap).
        landing: asyncio.Task | None = None

        async def land_after(prev: asyncio.Task | None, block: int, buf: memoryview) -> None:
            if prev is not None:
                await prev
            await self.landed(name, block, tier, buf, source=source)

        try:
            for block in h["blocks"]:
                info = state.manifest.blocks[block]
                if tier == "disk":
                    buf = memoryview(bytearray(info.size_bytes))
                    await asyncio.to_thread(self._read_source, source, name, info, buf)
                    await asyncio.to_thread(self.disk.write, name, info, buf)
                    continue
                buf = self.target_buffer(name, block, tier)
                await asyncio.to_thread(self._read_source, source, name, info, buf)
                landing = asyncio.get_running_loop().create_task(land_after(landing, block, buf))
            fetched_s = time.perf_counter() - t0
            if landing is not None:
                await landing
        except BaseException:
            if landing is not None:
                landing.cancel()
            raise
        return {"seconds": time.perf_counter() - t0, "fetch_seconds": fetched_s}

    def _read_source(self, source: str, name: str, info, buf: memoryview) -> None:
        if source == "host":  # warm start: this node's own host copy into another tier
            held = self.host_cache.get(name, info.index)
            if held is None:
                raise SurgeError(f"node {self.node} holds no host copy of block {info.index}")
            buf[: info.size_bytes] = held[: info.size_bytes]
        elif source == "disk":
            self.disk.read_into(name, info, buf)
        elif source == "remote":
            if self.remote is None:
                raise SurgeError(f"node {self.node} has no registry configured")
            self.remote.read_into(name, info, buf)
        else:
            raise ValueError(f"unknown source {source!r} (host, disk or remote)")

    async def op_evict(self, conn: Connection, h: dict, p: memoryview) -> dict:
        name, tier = h["model"], h.get("tier", "host")
        state = self.model(name)
        for block in h["blocks"]:
            if tier == "host":
                self.host_cache.evict(name, block)
            elif tier == "disk":
                self.disk.evict(name, state.manifest.blocks[block])
            elif tier == "gpu":
                state.gpu_buffers.pop(block, None)
                if not state.gpu_buffers:
                    state.runner = None
            if self.buffer_of(name, block) is None and block in state.present:
                state.present[block].clear()
        return {}

    async def op_checksums(self, conn: Connection, h: dict, p: memoryview) -> dict:
        """crc32 of every block held in host or gpu memory, recomputed now."""
        name = h["model"]
        out = {}
        for block in range(self.model(name).manifest.num_blocks):
            buf = self.buffer_of(name, block)
            if buf is not None:
                out[str(block)] = block_checksum(buf)
        return {"checksums": out}

    async def op_generate(self, conn: Connection, h: dict, p: memoryview) -> dict:
        """Greedy/seeded generation with this node's gpu-tier blocks (a full local instance)."""
        state = self.model(h["model"])
        if state.runner is None or len(state.gpu_buffers) < state.manifest.num_blocks:
            raise SurgeError(f"node {self.node} does not hold every block of {h['model']} in gpu")

        def run() -> list[int]:
            from surge.engine.llm_engine import LLMEngine, LocalExecutor
            from surge.engine.sampling import SamplingParams

            engine = LLMEngine(state.manifest, self.config.engine, LocalExecutor(state.runner))
            params = SamplingParams(**h.get("params", {}))
            return engine.generate([list(h["prompt_token_ids"])], params)[0].token_ids

        return {"token_ids": await asyncio.to_thread(run)}

    async def op_shutdown(self, conn: Connection, h: dict, p: memoryview) -> dict:
        self._stop.set()
        return {}


async def run_agent(config: AgentConfig) -> None:
    """Start an agent, announce its port on stdout, serve until shutdown."""
    import signal

    if config.preload_engine:
        import_engine()
    agent = NodeAgent(config)
    port = await agent.start()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, agent._stop.set)
    sys.stdout.write(json.dumps({"ready": True, "node": config.node, "port": port}) + "\n")
    sys.stdout.flush()
    await agent.serve_forever()
