"""Ray launcher: one node agent per Ray actor, data still over surge's own transport.

What flows: the controller asks for N agents; `RayCluster` connects to a Ray cluster (an
existing one at `address`, or a new local one on loopback), reserves a placement group of one
bundle per agent (`ray_placement.py`: one GPU each where the cluster has GPUs, so Ray sets
each actor's CUDA_VISIBLE_DEVICES; PACK, STRICT_SPREAD or SPREAD by the `placement`
setting), reads which Ray node each bundle landed on (agents on one node form a host group),
and starts one `NodeAgentActor` per bundle; each actor runs `surge node run` as a child
process (inheriting its GPUs), reads its ready line and reports (host, port, pid). The
controller then talks to the agents exactly as with `LocalCluster`: its own framed
connections with the cluster token (an argument of the actor's `start` call, then
`SURGE_TOKEN` in the child's environment, never on a command line).
Only actor calls (start, address, stop) go through Ray; blocks and requests never do.

An agent exits on its own when its actor's process dies (it watches its parent), so
killing the job or the Ray cluster leaves no agent behind.
"""

import logging
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from surge.config import EngineConfig, compile_decode_default
from surge.errors import SurgeError
from surge.runtime.launch.agent_process import agent_argv, agent_env, wait_ready
from surge.runtime.launch.ray_placement import host_groups, plan_placement
from surge.runtime.node.context import AgentConfig
from surge.runtime.security.tls import TlsConfig
from surge.runtime.transport import STALL_TIMEOUT_S

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayClusterConfig:
    """N agents as Ray actors."""

    num_nodes: int = 4
    address: str | None = None
    """A running Ray cluster ("HOST:PORT" or "auto"); None starts a local one on loopback."""
    agent_host: str = "127.0.0.1"
    """Where agents listen; "node-ip" means the Ray node's own address (multi-machine)."""
    link_gbps: float | None = None
    remote_dir: Path | None = None
    """Model registry directory; must be readable at the same path on every Ray node."""
    remote_gbps: float | None = None
    """Read cap of the registry as seen from each agent."""
    max_num_seqs: int = 64
    max_kv_tokens: int = 16384
    """KV-cache capacity (tokens) of every runner on every agent."""
    preload_engine: bool = True
    fuse_projections: bool = True
    """Every agent's `EngineConfig.fuse_projections`."""
    compile_decode: bool = field(default_factory=compile_decode_default)
    """Every agent's `EngineConfig.compile_decode`."""
    compile_quiet_s: float = EngineConfig.compile_quiet_s
    compile_defer_max_s: float = EngineConfig.compile_defer_max_s
    """Every agent's `EngineConfig` settings of the same names (the compile gate)."""
    num_cpus_per_agent: float = 0.0
    """Ray CPUs each actor reserves (0: the agent is placed without reserving a CPU)."""
    gpus_per_agent: float | None = None
    """Ray GPUs each actor reserves (None: one where the cluster has GPUs, else none)."""
    allow_plain: bool = False
    """Agents on a non-loopback `agent_host` without `tls` (frames in clear)."""
    placement: str = "auto"
    """"pack" (fill a machine's GPUs first), "spread" (one agent per Ray node) or "auto"
    (pack agents that hold a GPU, spread the others as far as Ray can); `ray_placement.py`."""
    start_timeout_s: float = 120.0
    stall_timeout_s: float = STALL_TIMEOUT_S
    """Every agent's `AgentConfig.stall_timeout_s` (`transport.STALL_TIMEOUT_S`)."""
    tls: TlsConfig | None = None
    """TLS files of every agent (None: plain TCP); the same paths must exist on every Ray
    node (a shared mount, or a Secret mounted alike in each pod)."""


def agent_config(
    node: int, cluster_id: str, token: str, disk_dir: str, host: str, opts: dict
) -> AgentConfig:
    """One agent's settings, made inside its actor; `opts` holds the JSON values of
    `RayClusterConfig` that cross to the actor (link_gbps, remote_dir, remote_gbps,
    max_num_seqs, max_kv_tokens, preload_engine, fuse_projections, compile_decode,
    compile_quiet_s, compile_defer_max_s,
    stall_timeout_s, tls) and this agent's host_group and host_mates."""
    return AgentConfig(
        node=node,
        cluster_id=cluster_id,
        token=token,
        disk_dir=Path(disk_dir),
        host=host,
        egress_gbps=opts["link_gbps"],
        ingress_gbps=opts["link_gbps"],
        remote_dir=Path(opts["remote_dir"]) if opts["remote_dir"] else None,
        remote_gbps=opts["remote_gbps"],
        engine=EngineConfig(
            max_num_seqs=opts["max_num_seqs"],
            max_kv_tokens=opts["max_kv_tokens"],
            fuse_projections=opts["fuse_projections"],
            compile_decode=opts["compile_decode"],
            compile_quiet_s=opts["compile_quiet_s"],
            compile_defer_max_s=opts["compile_defer_max_s"],
        ),
        preload_engine=opts["preload_engine"],
        allow_plain=bool(opts.get("allow_plain")),
        host_group=opts.get("host_group"),
        host_mates=tuple(opts.get("host_mates", ())),
        tls=TlsConfig(*map(Path, opts["tls"])) if opts.get("tls") else None,
        stall_timeout_s=opts["stall_timeout_s"],
    )


class NodeAgentActor:
    """The body of one Ray actor: owns one `surge node run` child process."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.work_dir: str | None = None

    def start(
        self, node: int, cluster_id: str, host: str, opts: dict, token: str, timeout_s: float
    ) -> dict[str, Any]:
        """Start the agent (the cluster token goes into its environment) and wait for its
        ready line; returns {host, port, pid}."""
        if host == "node-ip":
            import ray

            host = ray.util.get_node_ip_address()
        self.work_dir = tempfile.mkdtemp(prefix=f"surge-ray-node{node}-")
        config = agent_config(node, cluster_id, token, self.work_dir, host, opts)
        self.proc = subprocess.Popen(
            agent_argv(config), stdout=subprocess.PIPE, env=agent_env(token)
        )
        port = wait_ready(node, self.proc, time.monotonic() + timeout_s)
        return {"host": host, "port": port, "pid": self.proc.pid}

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; remove the disk tier."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a Ray address nobody listens at (`ray.init` would retry for minutes)."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise SurgeError(f"--ray-address must be HOST:PORT or auto (got {address!r})")
    try:
        socket.create_connection((host, int(port)), timeout_s).close()
    except OSError as e:
        raise SurgeError(f"cannot reach Ray at {address}: {e.strerror or e}") from None


@dataclass
class _Agent:
    pid: int
    actor: Any


class RayCluster:
    """Same surface as `LocalCluster` for the controller: `start`, `stop`, `addresses`,
    `token`, `pids`."""

    def __init__(self, config: RayClusterConfig) -> None:
        if config.num_nodes < 1:
            raise SurgeError("a cluster needs at least one node")
        self.config = config
        self.token = secrets.token_hex(16)
        self.cluster_id = secrets.token_hex(3)
        self.addresses: dict[int, tuple[str, int]] = {}
        self.agents: dict[int, _Agent] = {}
        self._started_ray = False
        self._connected = False
        """This cluster called `ray.init` (so `stop` disconnects; a caller's own Ray stays)."""
        self._pg: Any = None
        """The agents' placement group (removed on stop)."""

    @property
    def pids(self) -> dict[int, int]:
        """Agent process ids (on their Ray nodes)."""
        return {n: a.pid for n, a in self.agents.items()}

    def _init_ray(self) -> Any:
        try:
            import ray
        except ImportError:
            raise SurgeError(
                "--launcher ray needs Ray: pip install 'surge[ray]' (ray==2.60.0)"
            ) from None
        if self.config.address not in (None, "auto"):
            _check_reachable(self.config.address)
        if not ray.is_initialized():
            kw: dict[str, Any] = {"log_to_driver": False}
            if self.config.address is None:  # a new local cluster stays on loopback
                kw.update(include_dashboard=False, _node_ip_address="127.0.0.1")
                self._started_ray = True
            try:
                ray.init(address=self.config.address, **kw)
            except Exception as e:  # ConnectionError, ValueError, ...
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise SurgeError(f"cannot start or reach Ray: {first}") from None
            self._connected = True
        return ray

    def _place(self, ray: Any) -> tuple[Any, dict[int, tuple[str | None, tuple[int, ...]]]]:
        """Reserve the placement group; (its plan, each agent's host group and mates)."""
        from ray.util.placement_group import placement_group, placement_group_table

        c = self.config
        gpus = float(ray.cluster_resources().get("GPU", 0.0))
        plan = plan_placement(
            c.num_nodes, c.num_cpus_per_agent, c.gpus_per_agent, c.placement, gpus
        )
        self._pg = placement_group(list(plan.bundles), strategy=plan.strategy)
        try:
            ray.get(self._pg.ready(), timeout=c.start_timeout_s)
        except Exception:
            alive = sum(1 for n in ray.nodes() if n.get("Alive"))
            raise SurgeError(
                f"Ray could not place {c.num_nodes} agents ({plan.strategy}, "
                f"{plan.bundles[0]} each) in {c.start_timeout_s:.0f} s on its {alive} nodes "
                "(placement 'spread' needs a node per agent; fewer --nodes, or more Ray nodes)"
            ) from None
        table = placement_group_table(self._pg)["bundles_to_node_id"]
        return plan, host_groups({int(i): str(n) for i, n in table.items()})

    def start(self) -> None:
        ray = self._init_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_cls = ray.remote(NodeAgentActor)
        c = self.config
        try:
            plan, groups = self._place(ray)
        except SurgeError:
            self.stop()
            raise
        opts = {
            "link_gbps": c.link_gbps,
            "remote_dir": str(c.remote_dir) if c.remote_dir else None,
            "remote_gbps": c.remote_gbps,
            "max_num_seqs": c.max_num_seqs,
            "max_kv_tokens": c.max_kv_tokens,
            "fuse_projections": c.fuse_projections,
            "compile_decode": c.compile_decode,
            "compile_quiet_s": c.compile_quiet_s,
            "compile_defer_max_s": c.compile_defer_max_s,
            "preload_engine": c.preload_engine,
            "allow_plain": c.allow_plain,
            "stall_timeout_s": c.stall_timeout_s,
            "tls": [str(c.tls.cert_path), str(c.tls.key_path), str(c.tls.ca_path)]
            if c.tls
            else None,
        }
        started = {}
        for node in range(c.num_nodes):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=node
            )
            actor = actor_cls.options(
                num_cpus=plan.cpus_per_agent,
                num_gpus=plan.gpus_per_agent,
                scheduling_strategy=strategy,
            ).remote()
            self.agents[node] = _Agent(0, actor)
            group, mates = groups[node]
            mine = {**opts, "host_group": group, "host_mates": list(mates)}
            started[node] = actor.start.remote(
                node, self.cluster_id, c.agent_host, mine, self.token, c.start_timeout_s
            )
        try:
            for node, ref in started.items():
                info = ray.get(ref, timeout=c.start_timeout_s + 30)
                self.agents[node].pid = info["pid"]
                self.addresses[node] = (info["host"], info["port"])
        except Exception as e:
            self.stop()
            first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise SurgeError(f"node agents did not start on Ray: {first}") from None

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop every agent, then the actors; disconnect from Ray if this cluster connected
        (and shut it down if it started it); a Ray the caller had initialized stays up."""
        try:
            import ray
        except ImportError:
            return
        if not ray.is_initialized():
            return
        refs = [a.actor.stop.remote(grace_s) for a in self.agents.values()]
        try:
            ray.get(refs, timeout=grace_s + 15)
        except Exception as e:
            log.warning("stopping agents on Ray: %s", e)
        for a in self.agents.values():
            try:
                ray.kill(a.actor)
            except Exception as e:
                log.warning("killing an agent actor: %s", e)
        self.agents.clear()
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._pg)
            except Exception as e:
                log.warning("removing the agents' placement group: %s", e)
            self._pg = None
        if self._connected:
            ray.shutdown()  # a driver of a shared cluster only disconnects
            self._connected = False
