"""Kernel resources of an emulated cluster: network namespaces, veths, a bridge, tc, cgroups.

What flows: `NetnsCluster` (`launch/netns_cluster.py`) asks for a node (`add_node`), its link
shaping (`shape_link`) and its CPU quota (`cpu_group`), and at the end removes everything
under its prefix (`remove_all`); `set_loss` drops packets at random (nftables). Every
name starts with the launcher's prefix `sg<pid:6 hex><instance:1 hex>`, so `sweep_stale` can
find what a launcher that died (SIGKILL, power loss) left behind and remove it once that pid
is gone. Linux only, root only; `missing_requirements` says what is absent. iproute2 and
nftables run as subprocesses (`ip`, `tc`, `nft`).
"""

import contextlib
import ipaddress
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from surge.errors import SurgeError
from surge.runtime.launch.agent_process import pid_alive

log = logging.getLogger(__name__)

BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
"""RFC 2544's benchmarking range: each launcher takes one free /24 of it."""
PREFIX_RE = re.compile(r"^sg([0-9a-f]{6})[0-9a-f]")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 10_000
"""A short period: a node over its quota waits at most ~10 ms, not ~100 ms (pacing)."""
_instances = 0


def new_prefix() -> str:
    """A name prefix unique on this machine while this process lives."""
    global _instances
    _instances += 1
    return f"sg{os.getpid() & 0xFFFFFF:06x}{_instances % 16:x}"


def _run(*cmd: str, check: bool = True) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if check and out.returncode != 0:
        raise SurgeError(f"{' '.join(cmd)}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def cgroup_mode() -> str | None:
    """ "v1" (cpu.cfs_quota_us), "v2" (cpu.max) or None (no CPU controller mounted)."""
    if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        return "v1"
    controllers = CGROUP_V2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return "v2"
    return None


def missing_requirements(cpu_quota: bool = True) -> list[str]:
    """What this machine lacks for an emulated cluster (empty: nothing)."""
    missing = []
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        missing.append("root (network namespaces and tc need CAP_NET_ADMIN)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            missing.append(f"`{tool}` (apt-get install iproute2)")
    if not Path("/proc/self/ns/net").exists():
        missing.append("network namespace support in the kernel (CONFIG_NET_NS)")
    if cpu_quota and cgroup_mode() is None:
        missing.append("a cgroup CPU controller (v1 cpu.cfs_quota_us or v2 cpu.max)")
    return missing


def _owner_alive(name: str) -> bool:
    m = PREFIX_RE.match(name)
    return m is None or pid_alive(int(m.group(1), 16))


def _kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _netns_names() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list", check=False).splitlines()]


def _link_names() -> list[str]:
    names = []
    for line in _run("ip", "-o", "link", "show", check=False).splitlines():
        parts = line.split(": ")
        if len(parts) > 1:
            names.append(parts[1].split("@")[0])
    return names


def _cgroup_dirs() -> list[Path]:
    mode = cgroup_mode()
    root = CGROUP_V1_CPU if mode == "v1" else CGROUP_V2 if mode == "v2" else None
    return sorted(root.glob("sg*")) if root is not None else []


def remove_all(prefix: str | None = None, stale_only: bool = False) -> int:
    """Remove namespaces (and their processes), links and cgroups named `prefix`* — or,
    with `stale_only`, those of every launcher whose process is gone. Returns the count."""

    def ours(name: str) -> bool:
        if not PREFIX_RE.match(name):
            return False
        if prefix is not None and not name.startswith(prefix):
            return False
        return not (stale_only and _owner_alive(name))

    removed = 0
    for ns in filter(ours, _netns_names()):
        pids = _run("ip", "netns", "pids", ns, check=False).split()
        _kill_pids([int(p) for p in pids if p.isdigit()])
        _run("ip", "netns", "del", ns, check=False)
        removed += 1
    for link in filter(ours, _link_names()):
        # Deleting a node's namespace deletes its veth pair; the bridge remains.
        _run("ip", "link", "del", link, check=False)
        removed += 1
    for group in (g for g in _cgroup_dirs() if ours(g.name)):
        procs = group / "cgroup.procs"
        for _ in range(50):
            with contextlib.suppress(OSError):
                _kill_pids([int(p) for p in procs.read_text().split()])
                group.rmdir()
                break
            time.sleep(0.1)
        else:
            log.warning("could not remove cgroup %s", group)
        removed += 1
    return removed


def sweep_stale() -> int:
    """Remove what crashed launchers left behind (their pid no longer runs)."""
    n = remove_all(stale_only=True)
    if n:
        log.warning("removed %d resources of emulated clusters whose launcher died", n)
    return n


def free_subnet(seed: int) -> ipaddress.IPv4Network:
    """A /24 of the benchmarking range that no interface on this machine uses."""
    used = []
    for line in _run("ip", "-o", "-4", "addr", "show", check=False).splitlines():
        m = re.search(r"inet (\S+)", line)
        if m:
            used.append(ipaddress.ip_interface(m.group(1)).network)
    subnets = list(BENCH_NET.subnets(new_prefix=24))
    for i in range(len(subnets)):
        net = subnets[(seed + i) % len(subnets)]
        if not any(net.overlaps(u) for u in used):
            return net
    raise SurgeError("every /24 of 198.18.0.0/15 is in use on this machine")


@dataclass(frozen=True)
class NodeNet:
    """One emulated node's network: its namespace, its veth ends, its address."""

    netns: str
    host_dev: str
    """The bridge's end: its egress is the node's ingress."""
    node_dev: str
    """The node's end, inside the namespace: its egress is the node's egress."""
    address: str


MTU = 9000
"""Jumbo frames, as on a datacenter fabric: headers cost 0.7% of a shaped link, not 4.4%."""


def add_bridge(prefix: str, net: ipaddress.IPv4Network) -> str:
    bridge = f"{prefix}br"
    _run("ip", "link", "add", bridge, "mtu", str(MTU), "type", "bridge")
    _run("ip", "addr", "add", f"{net[1]}/{net.prefixlen}", "dev", bridge)
    _run("ip", "link", "set", bridge, "up")
    return bridge


def add_node(prefix: str, bridge: str, net: ipaddress.IPv4Network, node: int) -> NodeNet:
    """A namespace with a veth into `bridge` and address .(10+node) of `net`."""
    nn = NodeNet(
        f"{prefix}-node{node}", f"{prefix}h{node}", f"{prefix}n{node}", str(net[10 + node])
    )
    _run("ip", "netns", "add", nn.netns)
    _run(
        "ip",
        "link",
        "add",
        nn.host_dev,
        "mtu",
        str(MTU),
        "type",
        "veth",
        "peer",
        "name",
        nn.node_dev,
        "mtu",
        str(MTU),
    )
    _run("ip", "link", "set", nn.node_dev, "netns", nn.netns)
    _run("ip", "link", "set", nn.host_dev, "master", bridge, "up")
    _run("ip", "-n", nn.netns, "addr", "add", f"{nn.address}/{net.prefixlen}", "dev", nn.node_dev)
    _run("ip", "-n", nn.netns, "link", "set", nn.node_dev, "up")
    _run("ip", "-n", nn.netns, "link", "set", "lo", "up")
    # A pooled peer connection idles between blocks; restarting slow start after each idle
    # spell would cost every block transfer several round trips (datacenter hosts turn it off).
    _run("ip", "netns", "exec", nn.netns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0")
    return nn


def shape_link(dev: str, netns: str | None, gbps: float | None, latency_ms: float = 0.0) -> None:
    """Shape what leaves `dev`: htb at `gbps` (None: unlimited), then netem delay."""
    tc = ["tc", "-n", netns] if netns else ["tc"]
    # Re-shaping replaces the whole tree (root qdisc, classes, filters).
    _run(*tc, "qdisc", "del", "dev", dev, "root", check=False)
    if gbps is not None:
        kbit = max(16, int(gbps * 1e6))
        # A burst of ~1 ms at the rate (at least a 64 KiB GSO segment): htb then keeps the
        # rate within a few percent without starving a single TCP flow.
        burst = ["burst", str(max(65536, int(gbps * 1e9 / 8 / 1000)))]
        burst += ["cburst", burst[1]]
        _run(*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "20")
        _run(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
             "rate", f"{kbit}kbit", "ceil", f"{kbit}kbit", *burst)  # fmt: skip
        # Small packets (ACKs of the node's downloads, requests, control frames) go first,
        # as a NIC's per-flow queueing would let them: behind a deep bulk queue they would
        # slow every transfer into this node by its queueing delay.
        for cls, prio, share in (("1:10", "0", 0.1), ("1:20", "1", 0.9)):
            _run(*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", cls, "htb",
                 "rate", f"{max(8, int(kbit * share))}kbit", "ceil", f"{kbit}kbit",
                 "prio", prio, *burst)  # fmt: skip
        _run(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
             "u32", "match", "u16", "0x0000", "0xfc00", "at", "2", "flowid", "1:10")  # fmt: skip
        parent = ["parent", "1:20", "handle", "20:"]
    else:
        parent = ["root"]
    if latency_ms > 0:
        try:
            _run(*tc, "qdisc", "replace", "dev", dev, *parent, "netem",
                 "delay", f"{latency_ms}ms", "limit", "100000")  # fmt: skip
        except SurgeError as e:
            raise SurgeError(
                f"link latency needs tc netem, which this kernel lacks (CONFIG_NET_SCH_NETEM): {e}"
            ) from None


LOSS_TABLE = "surge_loss"


def set_loss(netns: str, loss_pct: float) -> None:
    """Drop `loss_pct`% of the packets a node sends and of those it receives, at random
    (nftables `numgen random` in the node's namespace; not netem, which some kernels lack).
    0 removes the rule. The table lives in the namespace and goes with it."""
    if not 0.0 <= loss_pct < 100.0:
        raise SurgeError(f"loss_pct must be in [0, 100) (got {loss_pct})")
    nft = ["ip", "netns", "exec", netns, "nft"]
    _run(*nft, "delete", "table", "inet", LOSS_TABLE, check=False)
    if loss_pct == 0:
        return
    if shutil.which("nft") is None:
        raise SurgeError("packet loss needs `nft` (apt-get install nftables)")
    per_10k = str(max(1, round(loss_pct * 100)))
    _run(*nft, "add", "table", "inet", LOSS_TABLE)
    for chain, hook, iface in (("out", "output", "oifname"), ("in", "input", "iifname")):
        _run(*nft, "add", "chain", "inet", LOSS_TABLE, chain,
             f"{{ type filter hook {hook} priority 0 ; }}")  # fmt: skip
        _run(*nft, "add", "rule", "inet", LOSS_TABLE, chain, iface, "!=", "lo",
             "numgen", "random", "mod", "10000", "<", per_10k, "counter", "drop")  # fmt: skip


def dropped_packets(netns: str) -> int:
    """Packets `set_loss` has dropped in this namespace so far (tests: the fault was real)."""
    out = _run("ip", "netns", "exec", netns, "nft", "list", "table", "inet", LOSS_TABLE,
               check=False)  # fmt: skip
    return sum(int(n) for n in re.findall(r"counter packets (\d+)", out))


def set_link_up(dev: str, netns: str | None, up: bool) -> None:
    """Take a node's link down or up (fault injection)."""
    ns = ["-n", netns] if netns else []
    _run("ip", *ns, "link", "set", dev, "up" if up else "down")


def cpu_group(name: str, cores: float) -> Path:
    """A cgroup limited to `cores` CPUs; returns the file a pid is written to, to join it."""
    mode = cgroup_mode()
    quota_us = max(1000, int(cores * CFS_PERIOD_US))
    if mode == "v1":
        group = CGROUP_V1_CPU / name
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota_us))
    elif mode == "v2":
        with contextlib.suppress(OSError):
            (CGROUP_V2 / "cgroup.subtree_control").write_text("+cpu")
        group = CGROUP_V2 / name
        group.mkdir(exist_ok=True)
        (group / "cpu.max").write_text(f"{quota_us} {CFS_PERIOD_US}")
    else:
        raise SurgeError("no cgroup CPU controller is mounted (v1 cpu or v2 with +cpu)")
    return group / "cgroup.procs"


def resources(prefix: str) -> list[str]:
    """Namespaces, links and cgroups named `prefix`* that exist now (tests: nothing leaked)."""
    names = _netns_names() + _link_names() + [g.name for g in _cgroup_dirs()]
    return [n for n in names if n.startswith(prefix)]


def fast_path(dev: str, netns: str | None, match: str, peers: list[str], gbps: float) -> None:
    """Traffic on `dev` to (`match` "dst") or from ("src") `peers` bypasses the node's link
    cap in a class of its own at `gbps`: a host group's fast link (the NVLink analogue)."""
    tc = ["tc", "-n", netns] if netns else ["tc"]
    kbit = f"{max(16, int(gbps * 1e6))}kbit"
    burst = ["burst", str(max(65536, int(gbps * 1e9 / 8 / 1000)))]
    _run(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:30", "htb",
         "rate", kbit, "ceil", kbit, *burst)  # fmt: skip
    for peer in peers:
        _run(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "0",
             "u32", "match", "ip", match, f"{peer}/32", "flowid", "1:30")  # fmt: skip


def sent_bytes(dev: str, netns: str | None) -> int:
    """Bytes the shaped root qdisc of `dev` has sent so far (every class: what the kernel
    let through this link's cap, whoever's socket it came from)."""
    tc = ["tc", "-n", netns] if netns else ["tc"]
    out = _run(*tc, "-s", "qdisc", "show", "dev", dev, check=False)
    m = re.search(r"qdisc htb 1: root.*?Sent (\d+) bytes", out, re.S)
    return int(m.group(1)) if m else 0
