"""Local launcher: N node agents as processes on this machine, with per-node link caps.

`LocalCluster` starts `surge node run` processes, waits until each prints its port, tells
every agent its peers, and stops them all on exit — SIGTERM, then SIGKILL after a grace
period — so no process outlives a test, even a failing one. Agents also exit on their own
if the launching process dies.

Files: without `work_dir`, the agents' disk tiers live in a temporary directory
`surge-cluster-<launcher pid>-<cluster id>` that `start` makes and `stop` removes (building
a cluster or asking for an agent's settings makes nothing). A launcher killed outright
(SIGKILL) runs no cleanup: the next cluster to start removes the directories of launchers
whose pid no longer runs (`sweep_stale_work_dirs`).
"""

import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from surge.config import EngineConfig, compile_decode_default
from surge.emulation import EmulatedNode, Emulation
from surge.errors import SurgeError
from surge.runtime.client import ClusterClient
from surge.runtime.launch.agent_process import (
    agent_argv,
    agent_env,
    local_agent_threads,
    pid_alive,
    spawn_agent,
    wait_ready,
)
from surge.runtime.node.context import AgentConfig
from surge.runtime.protocol import SetPeersOp
from surge.runtime.security.tls import TlsConfig
from surge.runtime.transport import DEFAULT_HOST, STALL_TIMEOUT_S

log = logging.getLogger(__name__)

WORK_DIR_PREFIX = "surge-cluster-"
"""Temporary work directories are named `<prefix><launcher pid>-<cluster id>`."""


@dataclass(frozen=True)
class LocalClusterConfig:
    """A cluster of agent processes on this machine."""

    num_nodes: int = 4
    link_gbps: float | None = None
    """Egress and ingress cap of every node (None: unlimited loopback)."""
    egress_gbps: tuple[float, ...] | None = None
    """Per-node egress caps (overrides link_gbps)."""
    ingress_gbps: tuple[float, ...] | None = None
    host_groups: tuple[tuple[int, ...], ...] = ()
    """Nodes of one group share a machine: they reach each other over a fast link of their
    own (`group_gbps`) that bypasses their NIC caps (GPUs of one host over NVLink), and
    report the group to the controller, whose multicast planner feeds each group with one
    network transfer (BlitzScale §5.1)."""
    group_gbps: float = 40.0
    """The host groups' fast link, Gbit/s."""
    remote_dir: Path | None = None
    """Model registry directory (stores by model name)."""
    remote_gbps: float | None = None
    work_dir: Path | None = None
    """Where disk tiers live (default: a temporary directory removed on stop)."""
    max_num_seqs: int = 64
    """Running-batch limit of every agent's engines."""
    max_kv_tokens: int = 16384
    """KV-cache capacity (tokens) of every runner on every agent."""
    threads_per_agent: int | None = None
    """Compute threads of each agent (None: this machine's cores / agents, at least 1) —
    N agents on one machine share its cores like N machines would own theirs; without this,
    every agent's OpenMP pool spins on every core and all of them slow down together."""
    preload_engine: bool = True
    """Agents import the engine (torch) before they report ready; turn off for clusters
    that only move bytes (faster start)."""
    fuse_projections: bool = True
    """Every agent's `EngineConfig.fuse_projections`."""
    compile_decode: bool = field(default_factory=compile_decode_default)
    """Every agent's `EngineConfig.compile_decode`."""
    compile_quiet_s: float = EngineConfig.compile_quiet_s
    compile_defer_max_s: float = EngineConfig.compile_defer_max_s
    """Every agent's `EngineConfig` settings of the same names (the compile gate)."""
    device: str = "auto"
    """Every agent's `EngineConfig.device` (`fake`: the tests' recorded fake GPU)."""
    start_timeout_s: float = 60.0
    stall_timeout_s: float = STALL_TIMEOUT_S
    """How long an agent or the controller may be silent before the others' connections to
    it fail and it counts as gone (`transport.STALL_TIMEOUT_S`): every agent's and this
    cluster's `client()`'s."""
    tls: TlsConfig | None = None
    """TLS between the agents and with their controller (`runtime/security/tls.py`; None: plain)."""
    extra_args: dict[int, list[str]] = field(default_factory=dict)
    """Extra command-line arguments for some nodes (testing: fault injection, step pacing)."""
    emulation: Emulation | None = None
    """GPU-time emulation (docs/emulation.md): the agents stand for the first `num_nodes`
    GPUs of the emulation's preset. Their links, disk, registry and host -> GPU rates, host
    groups and KV capacity come from it (scaled; the fields above for those are ignored)
    and their engine steps are paced as the emulated model on the emulated GPU."""

    @cached_property
    def emulated_nodes(self) -> tuple[EmulatedNode, ...]:
        """Each agent's emulated hardware (empty when not emulated)."""
        return () if self.emulation is None else self.emulation.nodes(self.num_nodes)

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """The host groups: the emulated machines' GPUs, else `host_groups`."""
        if self.emulation is not None:
            return self.emulation.host_groups(self.emulated_nodes)
        return self.host_groups

    def host_group(self, node: int) -> tuple[int, ...]:
        """The host group holding `node` (empty: a machine alone)."""
        return next((g for g in self.groups if node in g), ())

    def caps(self, node: int) -> tuple[float | None, float | None]:
        if self.emulation is not None:
            nic = self.emulation.scale.gbps(self.emulated_nodes[node].nic_gbps)
            return nic, nic
        eg = self.egress_gbps[node] if self.egress_gbps else self.link_gbps
        ig = self.ingress_gbps[node] if self.ingress_gbps else self.link_gbps
        return eg, ig

    def group_link_gbps(self, node: int) -> float:
        """The fast link of `node`'s host group."""
        if self.emulation is not None and (host := self.emulated_nodes[node].host_gbps):
            return self.emulation.scale.gbps(host)
        return self.group_gbps


class LocalCluster:
    """Context manager: `with LocalCluster(cfg) as cluster: ...` (agents stopped on exit)."""

    def __init__(self, config: LocalClusterConfig) -> None:
        if config.num_nodes < 1:
            raise SurgeError("a cluster needs at least one node")
        self.config = config
        self.token = secrets.token_hex(16)
        self.cluster_id = secrets.token_hex(3)
        self.procs: dict[int, subprocess.Popen] = {}
        self.addresses: dict[int, tuple[str, int]] = {}
        self._tmp = (
            Path(tempfile.gettempdir()) / f"{WORK_DIR_PREFIX}{os.getpid()}-{self.cluster_id}"
        )
        """The temporary work directory (named now; made by `start`, removed by `stop`)."""
        self._tmp_made = False
        self._abort = threading.Event()
        """Set by `stop`: a `start` in progress gives up."""
        self._starting = threading.Lock()

    def __enter__(self) -> "LocalCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def work_dir(self) -> Path:
        """Where the agents' disk tiers live: `config.work_dir`, else a temporary directory
        that exists from `start` to `stop`."""
        return self.config.work_dir if self.config.work_dir is not None else self._tmp

    def make_work_dir(self) -> None:
        """Sweep what killed launchers left, then make the temporary work directory (the
        first step of `start`)."""
        sweep_stale_work_dirs()
        if self.config.work_dir is None and not self._tmp_made:
            self._tmp.mkdir(mode=0o700)  # a name that exists already is an error, not ours
            self._tmp_made = True

    def check_groups(self) -> None:
        """Raise `SurgeError` unless the host groups are disjoint sets of this cluster's nodes."""
        grouped = [n for g in self.config.groups for n in g]
        nodes = set(range(self.config.num_nodes))
        if len(grouped) != len(set(grouped)) or not set(grouped) <= nodes:
            raise SurgeError(f"host groups {self.config.groups} must be disjoint node ids")

    def start(self) -> None:
        self.check_groups()
        self.make_work_dir()
        env = self._agent_env()
        with self._starting:  # `stop` from another thread waits for this to give up
            for node in range(self.config.num_nodes):
                self._check_aborted()
                cmd = agent_argv(self.agent_config(node)) + self.config.extra_args.get(node, [])
                self.procs[node] = spawn_agent(cmd, env)
            deadline = time.monotonic() + self.config.start_timeout_s
            for node, proc in self.procs.items():
                self.addresses[node] = (DEFAULT_HOST, wait_ready(node, proc, deadline, self._abort))

    can_restart = True
    """`restart` brings a dead or frozen agent back (`NetnsCluster` cannot: its namespaces
    are made once, at start)."""

    def restart(self, node: int) -> tuple[str, int]:
        """Replace agent `node` (killed first if it still runs, e.g. frozen) by a fresh one
        with the same settings and disk tier; returns its new address. Its shared memory is
        removed first (a killed agent cannot unlink its own)."""
        with self._starting:
            self._check_aborted()
            old = self.procs.get(node)
            if old is not None:
                if old.poll() is None:
                    old.kill()
                    old.wait(10)
                if old.stdout:
                    old.stdout.close()
            for f in Path("/dev/shm").glob(f"surge_{self.cluster_id}_{node}_*"):
                f.unlink(missing_ok=True)
            cmd = agent_argv(self.agent_config(node)) + self.config.extra_args.get(node, [])
            proc = spawn_agent(cmd, self._agent_env())
            self.procs[node] = proc
            deadline = time.monotonic() + self.config.start_timeout_s
            self.addresses[node] = (DEFAULT_HOST, wait_ready(node, proc, deadline, self._abort))
            return self.addresses[node]

    def _agent_env(self) -> dict[str, str]:
        threads = local_agent_threads(self.config.num_nodes, self.config.threads_per_agent)
        return agent_env(self.token, threads)

    def _check_aborted(self) -> None:
        if self._abort.is_set():
            raise SurgeError("the cluster was stopped while it started")

    def agent_config(self, node: int) -> AgentConfig:
        """The settings of one of this cluster's agents."""
        eg, ig = self.config.caps(node)
        group = self.config.host_group(node)
        agent = AgentConfig(
            node=node,
            cluster_id=self.cluster_id,
            token=self.token,
            disk_dir=self.work_dir / f"node{node}",
            egress_gbps=eg,
            ingress_gbps=ig,
            host_group=f"host{min(group)}" if group else None,
            host_mates=tuple(m for m in group if m != node),
            host_gbps=self.config.group_link_gbps(node) if group else None,
            remote_dir=self.config.remote_dir,
            remote_gbps=self.config.remote_gbps,
            engine=EngineConfig(
                max_num_seqs=self.config.max_num_seqs,
                max_kv_tokens=self.config.max_kv_tokens,
                fuse_projections=self.config.fuse_projections,
                compile_decode=self.config.compile_decode,
                compile_quiet_s=self.config.compile_quiet_s,
                compile_defer_max_s=self.config.compile_defer_max_s,
                device=self.config.device,
            ),
            preload_engine=self.config.preload_engine,
            tls=self.config.tls,
            stall_timeout_s=self.config.stall_timeout_s,
        )
        return emulated_agent(agent, self.config) if self.config.emulation else agent

    def client(self) -> ClusterClient:
        """A controller-side client of every agent (call `await client.connect()`)."""
        tls = self.config.tls.load() if self.config.tls is not None else None
        return ClusterClient(self.addresses, self.token, tls, self.config.stall_timeout_s)

    async def wire_peers(self, client: ClusterClient) -> None:
        """Tell every agent where its peers listen, and pre-open the connection pool."""
        await client.broadcast(SetPeersOp(peers=dict(self.addresses)))

    def kill(self, node: int) -> None:
        """Kill one agent abruptly (failure tests)."""
        proc = self.procs[node]
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop every agent: SIGTERM, then SIGKILL after `grace_s` (a frozen agent too). Safe
        from another thread while `start` runs: that start gives up within a poll (0.2 s),
        so a stop takes about `grace_s` whatever state the cluster is in."""
        self._abort.set()
        with self._starting:
            self._stop_agents(grace_s)
        self._abort.clear()

    def _stop_agents(self, grace_s: float) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if proc.stdout:
                proc.stdout.close()
        # Segments of agents that were killed are unlinked by their resource trackers;
        # remove any that a crash still left behind.
        for f in Path("/dev/shm").glob(f"surge_{self.cluster_id}_*"):
            f.unlink(missing_ok=True)
        if self._tmp_made:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp_made = False

    def alive(self) -> list[int]:
        return [n for n, p in self.procs.items() if p.poll() is None]


def emulated_agent(agent: AgentConfig, config: LocalClusterConfig) -> AgentConfig:
    """`agent` as node `agent.node` of `config`'s emulation: its disk, registry and
    host -> GPU rates scaled, its KV capacity the emulated GPU's, its steps paced, its
    decode eager. Why eager: a paced step lasts the emulated GPU's time whatever the real
    one costs (while it fits), so compiling buys the emulation nothing, and the compile an
    agent starts as soon as it holds its layers (`engine/compiled.py`) runs during the
    scale-out, taking the shared cores the emulated cluster's transfers and pipeline
    openings need: measured, it doubled λScale's emulated K=4 multicast (1.11 vs 0.57
    emulated s, same sitting, D=80; docs/emulation.md)."""
    emulation = config.emulation
    assert emulation is not None
    hw, scale = config.emulated_nodes[agent.node], emulation.scale
    return replace(
        agent,
        remote_gbps=scale.gbps(hw.registry_gbps),
        disk_gbps=scale.gbps(hw.ssd_gbps),
        pcie_gbps=scale.gbps(hw.pcie_gbps),
        emulate=emulation.config.spec,
        emulated_gpu=hw.gpu,
        time_dilation=emulation.config.time_dilation,
        engine=replace(agent.engine, max_kv_tokens=emulation.kv_tokens(hw), compile_decode=False),
    )


def sweep_stale_work_dirs(root: Path | None = None) -> list[Path]:
    """Remove the temporary work directories (under `root`, default the system's temporary
    directory) of launchers whose pid no longer runs; returns them. A reused pid only keeps
    a stale directory a while longer."""
    removed = []
    for d in Path(root or tempfile.gettempdir()).glob(f"{WORK_DIR_PREFIX}*-*"):
        pid = d.name[len(WORK_DIR_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    if removed:
        log.info("removed %d work directories of clusters whose launcher died", len(removed))
    return removed
