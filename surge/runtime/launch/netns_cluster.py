"""Emulated cluster on one machine: each agent in its own network namespace, with
kernel-shaped links and its own CPU share (in the spirit of Mininet).

What flows: a `NetnsClusterConfig` in; out, the `LocalCluster` surface (`start`, `stop`,
`addresses`, `token`, `procs`, `client`, `wire_peers`, `kill`, `alive`) over agents that
listen on their node's address in a private 198.18.0.0/15 /24 behind one bridge. Each
node's egress and ingress caps are htb qdiscs on its veth pair (egress: the node's end;
ingress: the bridge's end), latency netem under them, random loss by nftables; the agents' own token
buckets are off. Each agent runs in a cgroup with a CPU quota (default: this machine's
cores / N, so N nodes together are the machine). The registry is a directory every
namespace sees (namespaces do not isolate the filesystem). The kernel resources live in
`netns.py`; everything is removed on `stop`, at interpreter exit, and — after a crash — by
the next launcher's sweep of prefixes whose pid is gone.
"""

import atexit
import ipaddress
import logging
import os
import time
from dataclasses import dataclass, replace

from surge.errors import SurgeError
from surge.runtime.launch import netns
from surge.runtime.launch.agent_process import agent_argv, agent_env, spawn_agent, wait_ready
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.node.context import AgentConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NetnsClusterConfig(LocalClusterConfig):
    """A `LocalClusterConfig` whose caps are enforced by the kernel, plus what only a
    kernel link and a cgroup can give."""

    latency_ms: float = 0.0
    """One-way delay added to every node's egress (tc netem; RTT is twice this)."""
    loss_pct: float = 0.0
    """Percent of packets dropped at random on every node's link, each direction (nftables)."""
    cpu_cores_per_node: float | None = None
    """CPU quota of each node (None: this machine's cores / num_nodes; 0: no quota)."""


def require_netns(cpu_quota: bool = True) -> None:
    """Raise one `SurgeError` naming everything this machine lacks for `--cluster netns`."""
    missing = netns.missing_requirements(cpu_quota)
    if missing:
        raise SurgeError("an emulated (netns) cluster needs " + "; ".join(missing))


class NetnsCluster(LocalCluster):
    """Context manager: `with NetnsCluster(cfg) as cluster: ...` (all removed on exit)."""

    can_restart = False

    config: NetnsClusterConfig

    def __init__(self, config: NetnsClusterConfig) -> None:
        super().__init__(config)
        self.prefix = netns.new_prefix()
        self.nets: dict[int, netns.NodeNet] = {}
        self.bridge: str | None = None
        self.subnet: ipaddress.IPv4Network | None = None

    @property
    def cores_per_node(self) -> float | None:
        cores = self.config.cpu_cores_per_node
        if cores is None:
            return (os.cpu_count() or 1) / self.config.num_nodes
        return cores or None

    def start(self) -> None:
        require_netns(self.cores_per_node is not None)
        self.check_groups()
        netns.sweep_stale()
        self.make_work_dir()
        atexit.register(self.stop)
        self.subnet = netns.free_subnet(os.getpid() * 16 + int(self.prefix[-1], 16))
        self.bridge = netns.add_bridge(self.prefix, self.subnet)
        cfg = self.config
        for node in range(cfg.num_nodes):
            nn = netns.add_node(self.prefix, self.bridge, self.subnet, node)
            self.nets[node] = nn
            eg, ig = cfg.caps(node)
            netns.shape_link(nn.node_dev, nn.netns, eg, cfg.latency_ms)
            netns.shape_link(nn.host_dev, None, ig)
            if cfg.loss_pct:
                netns.set_loss(nn.netns, cfg.loss_pct)
        for group in cfg.groups:
            self._group(group)
        threads = cfg.threads_per_agent or max(1, round(self.cores_per_node or 1))
        env = agent_env(self.token, threads)
        for node, nn in self.nets.items():
            cmd = ["ip", "netns", "exec", nn.netns, *agent_argv(self.agent_config(node))]
            cmd += cfg.extra_args.get(node, [])
            if self.cores_per_node is not None:
                procs = netns.cpu_group(nn.netns, self.cores_per_node)
                # The shell joins the cgroup, then execs into the namespace and the agent:
                # one pid throughout, a child of this process (agents watch their parent).
                cmd = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *cmd]
            self.procs[node] = spawn_agent(cmd, env)
        deadline = time.monotonic() + cfg.start_timeout_s
        for node, proc in self.procs.items():
            self.addresses[node] = (self.nets[node].address, wait_ready(node, proc, deadline))
        log.info(
            "netns cluster %s: %d nodes on %s, %s cores each",
            self.prefix, cfg.num_nodes, self.subnet, self.cores_per_node,
        )  # fmt: skip

    def _group(self, group: tuple[int, ...]) -> None:
        cfg = self.config
        for node in group:
            nn = self.nets[node]
            mates = [self.nets[m].address for m in group if m != node]
            eg, ig = cfg.caps(node)
            # The fast class hangs off the htb root, so a capped link is needed to hang it on;
            # an uncapped direction is fast already.
            if eg is not None:
                netns.fast_path(nn.node_dev, nn.netns, "dst", mates, cfg.group_link_gbps(node))
            if ig is not None:
                netns.fast_path(nn.host_dev, None, "src", mates, cfg.group_link_gbps(node))

    def agent_config(self, node: int) -> AgentConfig:
        base = super().agent_config(node)
        # The kernel shapes the links; the agent's token buckets would only double-count,
        # so it only reports its caps and host group. Its address is a private namespace of
        # this machine: frames never leave it, plain TCP is allowed there.
        host = self.nets[node].address if node in self.nets else base.host
        return replace(base, host=host, pace_links=False, allow_plain=True)

    def set_link(self, node: int, up: bool) -> None:
        """Take node's link down (its veth on the bridge side) or back up: fault injection."""
        netns.set_link_up(self.nets[node].host_dev, None, up)

    def set_loss(self, node: int, loss_pct: float) -> None:
        """Drop `loss_pct`% of node's packets each way from now on (0: stop): fault injection."""
        netns.set_loss(self.nets[node].netns, loss_pct)

    def stop(self, grace_s: float = 5.0) -> None:
        super().stop(grace_s)
        netns.remove_all(self.prefix)
        self.nets.clear()
        self.bridge = None
        atexit.unregister(self.stop)

    def link_bytes(self, node: int) -> tuple[int, int]:
        """(egress, ingress) bytes the kernel has let through node's shaped link so far."""
        nn = self.nets[node]
        return netns.sent_bytes(nn.node_dev, nn.netns), netns.sent_bytes(nn.host_dev, None)
