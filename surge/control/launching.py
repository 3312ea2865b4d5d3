"""Which launcher starts (or joins) the agents a controller drives, built from its config.

What flows: a `ControllerConfig` and the registry path in; an `AgentCluster` out (a
`LocalCluster` or `NetnsCluster` on this machine, a `RayCluster`, or a `StaticCluster` that
joins agents something else started). Launchers are imported only when chosen, so a loopback
cluster never imports Ray. Owned by control/; the controller calls it once at `start`.
"""

from pathlib import Path
from typing import Any, Protocol

from surge.control.settings import ControllerConfig
from surge.errors import SurgeError


class AgentCluster(Protocol):
    """What the controller needs of a launcher (`LocalCluster`, `RayCluster`,
    `StaticCluster`)."""

    addresses: dict[int, tuple[str, int]]
    token: str

    def start(self) -> None: ...
    def stop(self) -> None: ...


def launch_cluster(config: ControllerConfig, registry: Path) -> AgentCluster:
    """A `LocalCluster`, `RayCluster` (same surface) of `config.nodes` agents, or a
    `StaticCluster` joining that many running ones."""
    common: dict[str, Any] = {
        "num_nodes": config.nodes,
        "link_gbps": config.link_gbps,
        "remote_dir": registry,
        "max_num_seqs": config.max_num_seqs,
        "preload_engine": config.preload_engine,
        "fuse_projections": config.fuse_projections,
        "compile_decode": config.compile_decode,
        "compile_quiet_s": config.compile_quiet_s,
        "compile_defer_max_s": config.compile_defer_max_s,
        "stall_timeout_s": config.stall_timeout_s,
    }
    if config.emulation is not None and config.launcher != "local":
        raise SurgeError("--emulate needs --launcher local (loopback or netns cluster)")
    if config.emulation is not None:
        common["emulation"] = config.emulation
    if config.launcher == "static":
        from surge.runtime.launch.static_cluster import StaticCluster, StaticClusterConfig
        from surge.runtime.security.cluster_token import resolve_token

        return StaticCluster(
            StaticClusterConfig(
                agents=config.agents,
                token=resolve_token(config.token_file, "the controller"),
                num_nodes=config.nodes,
                tls=config.tls,
                timeout_s=config.agents_timeout_s,
            )
        )
    common["tls"] = config.tls
    if config.launcher == "ray":
        from surge.runtime.launch.ray_cluster import RayCluster, RayClusterConfig

        host = config.agent_host  # "node-ip": a cluster across hosts, each agent on its own
        placement = {
            "placement": config.ray_placement,
            "gpus_per_agent": config.ray_gpus_per_agent,
            "allow_plain": config.allow_plain,
        }
        return RayCluster(
            RayClusterConfig(address=config.ray_address, agent_host=host, **placement, **common)
        )
    if config.launcher != "local":
        raise SurgeError(f"launcher {config.launcher!r} is not one of local, ray, static")
    common |= {
        "egress_gbps": config.egress_gbps,
        "ingress_gbps": config.ingress_gbps,
        "host_groups": config.host_groups,
    }
    if config.cluster == "netns":
        from surge.runtime.launch.netns_cluster import NetnsCluster, NetnsClusterConfig

        return NetnsCluster(NetnsClusterConfig(**common))
    if config.cluster != "loopback":
        raise SurgeError(f"cluster {config.cluster!r} is not one of loopback, netns")
    from surge.runtime.launch.local import LocalCluster, LocalClusterConfig

    return LocalCluster(LocalClusterConfig(**common))


def agent_pids(cluster: Any) -> dict[int, int]:
    """Process id of each agent this controller started (none for agents it joined)."""
    if cluster is None:
        return {}
    pids = getattr(cluster, "pids", None)  # RayCluster: the actors' children
    if pids is not None:
        return dict(pids)
    return {n: p.pid for n, p in cluster.procs.items()}  # LocalCluster: our children
