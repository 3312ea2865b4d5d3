"""What every part of a node agent shares: its settings and a `NodeContext`.

The agent (`runtime/node/agent.py`) is composed of a server, a store (`node/store.py`), the
block data path (`node/transfer.py`) and model execution (`node/serving.py`,
`node/instances.py`). The server makes one `NodeContext` and hands it to the others; it
is all they know of each other besides the store, which the others are given explicitly.
"""

import asyncio
import gc
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from surge.config import EngineConfig
from surge.emulation import EmulationConfig, StepPacer
from surge.errors import SurgeError
from surge.policy.blitzscale.live_step import next_step
from surge.runtime.handshake import connect
from surge.runtime.node.inflight import InFlight
from surge.runtime.protocol import Event, Op, Reply
from surge.runtime.security.tls import ClusterTls, TlsConfig
from surge.runtime.token_bucket import TokenBucket
from surge.runtime.transport import (
    DEFAULT_HOST,
    STALL_TIMEOUT_S,
    Connection,
    ConnectionClosed,
    check_stall_timeout,
)


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
    pace_links: bool = True
    """Pace the NIC caps with the agent's token buckets; False where something else
    enforces them (the netns launcher's kernel qdiscs): the caps are then only reported."""
    host_group: str | None = None
    """The machine this agent shares with other agents (None: a machine alone); reported
    to the controller, whose multicast planner treats a host group as one NVLink group."""
    host_mates: tuple[int, ...] = ()
    """The other agents of its host group: connections to and from them bypass the NIC caps
    and are paced at `host_gbps` instead (the machine's own fast link)."""
    host_gbps: float | None = None
    """The host group's fast link (None: unpaced, reported as `policy.multicast.topology`'s
    `HOST_LINK_GBPS`)."""
    remote_dir: Path | None = None
    """The registry: a directory of stores, ROOT/<model>/manifest.json."""
    remote_gbps: float | None = None
    """Read cap of the registry as seen from this node."""
    disk_gbps: float | None = None
    """Read cap of this node's disk tier (None: as fast as the file system)."""
    pcie_gbps: float | None = None
    """Cap of a load from this node's host copy into its gpu tier (None: a plain copy)."""
    emulate: str | None = None
    """GPU-time emulation (`surge.emulation`): PRESET:MODEL this node's engine steps are
    paced as (None: not emulated, steps take what they take)."""
    emulated_gpu: str | None = None
    """With `emulate`: the GPU type this node stands for (a `gpus.json` entry)."""
    time_dilation: float = 1.0
    """With `emulate`: real seconds per emulated second."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    preload_engine: bool = True
    """Import the engine (torch) before announcing readiness, so the first block that lands
    in the gpu tier does not wait ~1.5 s for it."""
    tls: TlsConfig | None = None
    """TLS for every connection this agent accepts or makes (None: plain TCP; the token is
    proven, never sent, either way)."""
    allow_plain: bool = False
    """Listen on a non-loopback address without TLS (`--allow-plain`): emulated clusters on
    one machine, or a network the user trusts."""
    stall_timeout_s: float = STALL_TIMEOUT_S
    """How long a peer or controller may be silent before its connections fail and it counts
    as gone (`transport.STALL_TIMEOUT_S`; `--stall-timeout-s`)."""
    fault_corrupt_sends: int = 0
    """Testing only: corrupt the payload of this many block sends."""
    fault_shm_free_bytes: int | None = None
    """Testing: the free shared memory this agent sees (None: what /dev/shm has)."""

    def __post_init__(self) -> None:
        if (self.emulate is None) != (self.emulated_gpu is None):
            raise SurgeError("an emulated agent needs both emulate (PRESET:MODEL) and its GPU")
        if not self.time_dilation > 0:
            raise SurgeError(f"time_dilation must be > 0 (got {self.time_dilation})")
        check_stall_timeout(self.stall_timeout_s)


Handler = Callable[[Any, Connection, memoryview], Awaitable[Reply | None]]
"""An op handler: (typed op, its connection, its payload) -> the reply, or None when the
handler sent its own answer (one with a payload)."""
Handlers = dict[type[Op], Handler]
"""A part's ops: {op class: handler}; the server merges every part's table."""


def step_pacer(config: AgentConfig) -> StepPacer | None:
    """The pacer of an emulated agent's engine steps (None when not emulated)."""
    if config.emulate is None or config.emulated_gpu is None:
        return None
    emulation = EmulationConfig.parse(config.emulate, config.time_dilation)
    # whose step goes next on its one GPU: a live batch's last layers before the local
    # instance's next step (BlitzScale §5.2 Eq. 1, `live_step.next_step`, as the simulator)
    return StepPacer(emulation.profile, config.emulated_gpu, config.time_dilation, turn=next_step)


_engine_imported = False


def import_engine(compiled: bool = False) -> None:
    """Import the engine (torch, ~1.5 s) and load its one-row kernel if built (`engine/gemv.py`:
    ~0.1 s; an agent never compiles it) — at start-up, or while the first block travels. With
    `compiled` (`compile_decode`) also dynamo and inductor (~1 s more, sympy among them), which
    the first runner would otherwise import in a worker thread, holding the GIL while the
    event loop receives the blocks."""
    global _engine_imported
    if _engine_imported:
        return
    import surge.engine.runner
    from surge.engine import gemv

    if compiled:
        import surge.engine.compiled  # noqa: F401

    gemv.load()
    # What the import made lives as long as the agent: frozen, the garbage collector's full
    # passes no longer walk it (they took ~8% of the agents' CPU in the tests, most of it
    # walking torch's modules). Once only: later objects stay collectable.
    gc.freeze()
    _engine_imported = True


@dataclass
class NodeContext:
    """The agent's services that its parts use: identity, events, tasks, peers, pacing."""

    config: AgentConfig
    emit: Callable[[Event], Awaitable[None]]
    """Send an event to every subscriber."""
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]
    """Run a coroutine as a task the agent cancels when it closes."""
    egress: TokenBucket
    ingress: TokenBucket
    host_out: TokenBucket = field(default_factory=lambda: TokenBucket(None))
    """Paces traffic to host mates (the machine's fast link, this node's sending end)."""
    host_in: TokenBucket = field(default_factory=lambda: TokenBucket(None))
    peers: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Peer addresses by node id (set by the `set_peers` op)."""
    pacer: StepPacer | None = None
    """Under GPU-time emulation, what every engine step of this node is paced by."""
    tls: ClusterTls | None = None
    """This agent's TLS contexts (None: plain TCP)."""
    inflight: InFlight = field(default_factory=InFlight)
    """The running ops and their left-running work, by model (`drop_model` aborts them)."""
    compile_gate: threading.Event | None = None
    """Set while the node's engines may compile decode graphs (`compile_quiet.py`, made by
    the agent when `compile_decode` is on); None: they compile at once."""

    @property
    def node(self) -> int:
        return self.config.node

    async def dial(self, node: int) -> Connection:
        """A new authenticated connection to a peer, paced by this node's NIC caps."""
        if node not in self.peers:
            raise ConnectionClosed(f"node {node} is not a known peer of node {self.node}")
        host, port = self.peers[node]
        egress, ingress = self.buckets(node)
        tls = self.tls.client if self.tls is not None else None
        me = f"node-{self.node}"
        return await connect(
            host,
            port,
            self.config.token,
            me,
            egress,
            ingress,
            tls=tls,
            stall_timeout_s=self.config.stall_timeout_s,
        )

    def buckets(self, peer: int | None) -> tuple[TokenBucket, TokenBucket]:
        """(egress, ingress) pacing of a connection with `peer` (None: not an agent)."""
        if peer is not None and peer in self.config.host_mates:
            return self.host_out, self.host_in
        return self.egress, self.ingress
