"""The node agent: one process per node, owning that node's tiers and serving its blocks.

What flows in: typed ops (`runtime/protocol/`) from the controller and peers, as frames
on authenticated connections. What flows out: replies, block bytes to peers, and events
(block arrivals, failed pulls, tokens) to subscribers.

This file is the agent's server: sockets, the accept loop, dispatch by op class, events and
lifecycle. Its parts are composed, each given the `NodeContext` (and the store) it needs:
`AgentStore` (tiers and the load/evict/checksums ops), `AgentTransfer` (the block
data path: get_block, multicast pulls, pull_from, set_peers), `AgentCollective` (a gloo
group broadcast: the NCCL baseline), `AgentServing` (pipeline
stages) and `AgentInstances` (full local instances, with their P/D side). The server
answers `status`, `shutdown` and `subscribe` itself, and `register` and `drop_model`, which
reach every part: a register of another version of a model than the one held replaces it
in every tier, or is refused while an instance or stage runs on it (`policy.versions`).
"""

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
from typing import Any

from surge.errors import SurgeError
from surge.policy.versions import decide_register
from surge.runtime.handshake import AuthError, accept_hello
from surge.runtime.launch.agent_process import LAUNCHER_PID_ENV
from surge.runtime.node.collective import AgentCollective
from surge.runtime.node.compile_quiet import CompileQuiet
from surge.runtime.node.context import (
    AgentConfig,
    Handlers,
    NodeContext,
    import_engine,
    step_pacer,
)
from surge.runtime.node.device_share import AgentDeviceShare
from surge.runtime.node.instances import AgentInstances
from surge.runtime.node.model_state import ModelState
from surge.runtime.node.serving import AgentServing
from surge.runtime.node.store import AgentStore
from surge.runtime.node.transfer import AgentTransfer
from surge.runtime.protocol import (
    Ack,
    DropModelOp,
    DropReply,
    Event,
    Op,
    RegisterOp,
    RegisterReply,
    ShutdownOp,
    StatusOp,
    StatusReply,
    SubscribeOp,
    error_header,
    ok_header,
)
from surge.runtime.token_bucket import TokenBucket, gbps_to_bytes_per_s
from surge.runtime.transport import Connection, ConnectionClosed, RemoteError
from surge.wire import FrameError

__all__ = ["AgentConfig", "ModelState", "NodeAgent", "run_agent"]

log = logging.getLogger(__name__)

PARENT_CHECK_S = 1.0
DROP_WAIT_S = 10.0
"""How long `drop_model` waits for the model's aborted ops to clean up (a load's reads stop
at their next chunk: milliseconds; the bound only keeps a stuck op from holding it)."""


class NodeAgent:
    """The server side of one node."""

    def __init__(self, config: AgentConfig, memory: Any = None) -> None:
        """`memory`: the engine's device seam (`surge.engine.devmem`; a test's fake), else
        chosen by the engine's device setting."""
        self.config = config
        self.node = config.node
        rate = gbps_to_bytes_per_s

        def paced(gbps: float | None) -> float | None:
            return gbps if config.pace_links else None

        self.ctx = NodeContext(
            config=config,
            emit=self.emit,
            spawn=self._spawn,
            egress=TokenBucket(rate(eg) if (eg := paced(config.egress_gbps)) else None),
            ingress=TokenBucket(rate(ig) if (ig := paced(config.ingress_gbps)) else None),
            host_out=TokenBucket(rate(hg) if (hg := paced(config.host_gbps)) else None),
            host_in=TokenBucket(rate(hg) if hg else None),
            pacer=step_pacer(config),
            tls=config.tls.load() if config.tls is not None else None,
        )
        self.store = AgentStore(self.ctx, memory)
        self.transfer = AgentTransfer(self.ctx, self.store)
        self.collective = AgentCollective(self.ctx, self.store)
        self.device_share = AgentDeviceShare(self.ctx, self.store)
        self.serving = AgentServing(self.ctx, self.store)
        self.local = AgentInstances(self.ctx, self.store, self.serving.fetch_kv)
        self.handlers: Handlers = {
            StatusOp: self.op_status,
            ShutdownOp: self.op_shutdown,
            DropModelOp: self.op_drop_model,
            RegisterOp: self.op_register,
            **self.store.handlers(),
            **self.transfer.handlers(),
            **self.collective.handlers(),
            **self.device_share.handlers(),
            **self.serving.handlers(),
            **self.local.handlers(),
        }
        self.compile_quiet: CompileQuiet | None = None
        """The gate the node's engines compile decode graphs behind (`compile_decode`)."""
        if config.engine.compile_decode:
            self.compile_quiet = CompileQuiet(
                self.activity, config.engine.compile_quiet_s, config.engine.compile_defer_max_s
            )
            self.ctx.compile_gate = self.compile_quiet.gate
            self.ctx.inflight.on_track = self.compile_quiet.touch
        self.subscribers: list[Connection] = []
        self._tasks: set[asyncio.Task] = set()
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
        if self.compile_quiet is not None:
            self._spawn(self.compile_quiet.watch())
        return self.port

    def activity(self) -> tuple[bool, bool]:
        """What is in flight on this node: (holding) an op about a model (a load, a block
        sent or pulled, a multicast, an open, a one-off generate); (serving) a request in a
        local instance, a stage's step. Its engines compile decode graphs only after a quiet
        spell, or serving only past a bound (`compile_quiet.py`)."""
        return self.ctx.inflight.busy(), self.local.busy() or self.serving.busy()

    async def serve_forever(self) -> None:
        launcher = os.environ.get(LAUNCHER_PID_ENV, "")
        # An agent started by something else (a StatefulSet, systemd: `--launcher static`)
        # has no launcher to outlive; it runs until told to stop.
        parent = int(launcher) if launcher.isdigit() else None
        while not self._stop.is_set():
            # No orphans: an agent whose launcher died exits by itself.
            if parent is not None and os.getppid() != parent:
                log.warning("node %d: launcher is gone, exiting", self.node)
                break
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(PARENT_CHECK_S):
                    await self._stop.wait()
        await self.close()

    def stop(self) -> None:
        self._stop.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.transfer.close()
        self.serving.close()
        for conn in self.subscribers:
            conn.close()
        for task in list(self._tasks):
            task.cancel()
        self.store.close()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._server is not None
        while True:
            client, addr = await loop.sock_accept(self._server)
            conn = Connection(
                client, self.ctx.egress, self.ctx.ingress, self.ctx.config.stall_timeout_s
            )
            conn.peer = f"{addr[0]}:{addr[1]}"  # until its hello names it
            self._spawn(self._handle(conn))

    async def _handle(self, conn: Connection) -> None:
        """Serve one connection until it closes; a bad peer never takes the agent down."""
        try:
            tls = self.ctx.tls.server if self.ctx.tls is not None else None
            who = await accept_hello(conn, self.config.token, f"node-{self.node}", tls=tls)
            conn.peer = who
            peer = who.removeprefix("node-")
            conn.egress, conn.ingress = self.ctx.buckets(int(peer) if peer.isdigit() else None)
            while True:
                header, payload = await conn.recv()
                try:
                    op = Op.decode(header)
                except SurgeError as e:  # unknown op or bad field: say so, keep serving
                    await conn.send(error_header(str(e)))
                    continue
                if isinstance(op, SubscribeOp):
                    self.subscribers.append(conn)
                    await conn.send(ok_header(Ack()))
                    return  # the connection now belongs to the event stream
                await self._dispatch(conn, op, payload)
        except AuthError as e:  # a wrong certificate or token: one clear line
            log.warning("node %d: %s", self.node, e)
            conn.close()
        except (TimeoutError, ConnectionClosed, FrameError, OSError) as e:
            log.info("node %d: connection from %s ended: %s", self.node, conn.peer, e)
            if conn not in self.subscribers:
                conn.close()

    async def _dispatch(self, conn: Connection, op: Op, payload: memoryview) -> None:
        handler = self.handlers[type(op)]
        model = getattr(op, "model", None)
        try:
            # A drop or a register aborts the model's ops itself (never its own).
            if isinstance(model, str) and not isinstance(op, (DropModelOp, RegisterOp)):
                reply = await self.ctx.inflight.run(model, handler(op, conn, payload))
            else:
                reply = await handler(op, conn, payload)
        except (SurgeError, RemoteError) as e:
            await conn.send(error_header(f"{op.NAME}: {e}"))
            return
        except (ConnectionClosed, OSError):
            raise
        except Exception as e:  # a bug in a handler: answer, log, keep serving
            log.exception("node %d: op %s failed", self.node, op.NAME)
            await conn.send(error_header(f"{op.NAME}: internal error: {e!r}"))
            return
        if reply is not None:  # handlers that stream their own answer return None
            await conn.send(ok_header(reply))

    # ---- events ------------------------------------------------------------------

    async def emit(self, event: Event) -> None:
        frame = event.to_json()
        for conn in list(self.subscribers):
            try:
                async with conn.lock:
                    await conn.send(frame)
            except (ConnectionClosed, OSError):
                self.subscribers.remove(conn)
                conn.close()

    # ---- the server's own ops ----------------------------------------------------

    async def op_status(self, op: StatusOp, conn: Connection, p: memoryview) -> StatusReply:
        return StatusReply(
            node=self.node,
            port=self.port,
            models=self.store.holdings(),
            bytes_in=self.transfer.bytes_in,
            bytes_out=self.transfer.bytes_out,
            peers=tuple(sorted(self.ctx.peers)),
            running=self.local.running() + self.serving.running(),
            **self._pacing(),
        )

    def _pacing(self) -> dict[str, float | int]:
        """The emulation's step counts for `StatusReply` (none when not emulated)."""
        if self.ctx.pacer is None:
            return {}
        c = self.ctx.pacer.counts
        return {
            "emulated_steps": c.steps,
            "emulation_violations": c.violations,
            "emulation_overrun_s": round(c.overrun_s, 6),
        }

    async def op_drop_model(self, op: DropModelOp, conn: Connection, p: memoryview) -> DropReply:
        """Forget a model now (its deployment was deleted): its running ops are aborted
        (reads in worker threads stop at their next chunk) and have cleaned up, its
        instances and stages close, then every copy of it goes from every tier."""
        state = self.store.models.get(op.model)
        if state is not None:
            state.dropped.set()
        aborted = await self.ctx.inflight.abort(op.model, DROP_WAIT_S)
        closed = self.local.close_model(op.model) + self.serving.close_model(op.model)
        self.store.drop(op.model)
        if aborted or closed:
            log.info(
                "node %d: dropped %s (%d running ops aborted, %d instances/stages closed)",
                self.node, op.model, aborted, closed,
            )  # fmt: skip
        return DropReply(aborted_ops=aborted, closed=closed)

    async def op_register(self, op: RegisterOp, conn: Connection, p: memoryview) -> RegisterReply:
        """Learn a model's manifest. Another version than the one held replaces it: its
        running ops are aborted and every copy goes from every tier first, unless a local
        instance or pipeline stage runs on it: then the register is refused, naming them and
        the fix (`policy.versions.decide_register`; a copy is never of two versions)."""
        manifest = self.store.manifest_for(op)
        state = self.store.models.get(op.model)
        users = tuple(
            r.name for r in (*self.local.running(), *self.serving.running()) if r.model == op.model
        )
        held = None if state is None else state.manifest.digest
        decision = decide_register(op.model, self.node, held, manifest.digest, users)
        if decision.action == "refuse":
            raise SurgeError(decision.reason)
        if decision.action == "replace" and state is not None:
            state.dropped.set()  # reads in worker threads stop at their next chunk
            why = "was replaced by another version"
            aborted = await self.ctx.inflight.abort(op.model, DROP_WAIT_S, why)
            if self.store.models.get(op.model) is state:  # not replaced meanwhile
                self.store.drop(op.model)
            log.warning("node %d: %s (%d running ops aborted, every copy dropped)",
                        self.node, decision.reason, aborted)  # fmt: skip
        return self.store.register(op.model, manifest)

    async def op_shutdown(self, op: ShutdownOp, conn: Connection, p: memoryview) -> Ack:
        self._stop.set()
        return Ack()


async def run_agent(config: AgentConfig) -> None:
    """Start an agent, announce its port on stdout, serve until shutdown."""
    import signal

    if config.preload_engine:
        import_engine(config.engine.compile_decode)
    agent = NodeAgent(config)
    port = await agent.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, agent.stop)
    sys.stdout.write(json.dumps({"ready": True, "node": config.node, "port": port}) + "\n")
    sys.stdout.flush()
    await agent.serve_forever()
