"""Where the Ray launcher's agents go: a placement group with one bundle per agent, and the
host groups that follow from where the bundles landed. Pure (no Ray import): numbers in,
Ray's plain arguments out, so it is tested without a cluster.

What flows: the agent count, CPUs and GPUs per agent and the `placement` setting in; the
bundles and the strategy for `ray.util.placement_group` out. After placement, the Ray node
of each bundle in; each agent's host group (`AgentConfig.host_group`, `host_mates`) out:
agents on one Ray node share a machine, so the multicast planner feeds them with one
network transfer and they copy among themselves over the machine's fast link (BlitzScale
§5.1: one NVLink group). Owned by the runtime (`ray_cluster.py` carries it out).
"""

from dataclasses import dataclass

from surge.errors import SurgeError

PLACEMENTS = {"auto": "", "pack": "PACK", "spread": "STRICT_SPREAD"}
"""The `placement` setting -> Ray's placement-group strategy: "pack" fills a machine's GPUs
first (agents share machines: host groups, fast local copies); "spread" puts one agent per
machine (each its own NIC; needs as many Ray nodes as agents); "auto" packs agents that
hold a GPU and spreads the others as far as Ray can (SPREAD, best effort: one per node
where there are enough nodes)."""

MIN_BUNDLE_CPUS = 0.01
"""A bundle must ask for something: an agent that reserves no CPU and no GPU still asks for
this sliver of a CPU (Ray refuses empty bundles)."""


@dataclass(frozen=True)
class AgentPlacement:
    """The placement group to ask Ray for."""

    bundles: tuple[dict[str, float], ...]
    """One per agent, in node-id order: {"CPU": c, "GPU": g} (GPU absent when 0)."""
    strategy: str
    """"PACK", "STRICT_SPREAD" or "SPREAD"."""
    gpus_per_agent: float
    """What each agent actor reserves (Ray sets its CUDA_VISIBLE_DEVICES to those GPUs)."""
    cpus_per_agent: float


def plan_placement(
    num_agents: int,
    cpus_per_agent: float,
    gpus_per_agent: float | None,
    placement: str,
    cluster_gpus: float,
) -> AgentPlacement:
    """The placement group of `num_agents` agents. `gpus_per_agent` None: one GPU each where
    the cluster has GPUs (`cluster_gpus`), none otherwise. Too few GPUs, or a bad setting, is
    one `SurgeError` naming the numbers."""
    if placement not in PLACEMENTS:
        raise SurgeError(f"ray placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
    if num_agents < 1:
        raise SurgeError("a cluster needs at least one node")
    if cpus_per_agent < 0:
        raise SurgeError(f"CPUs per agent must be >= 0 (got {cpus_per_agent})")
    gpus = (1.0 if cluster_gpus > 0 else 0.0) if gpus_per_agent is None else gpus_per_agent
    if gpus < 0:
        raise SurgeError(f"GPUs per agent must be >= 0 (got {gpus})")
    if gpus * num_agents > cluster_gpus:
        raise SurgeError(
            f"{num_agents} agents with {gpus:g} GPU each need {gpus * num_agents:g} GPUs; the "
            f"Ray cluster has {cluster_gpus:g} (fewer --nodes, or ray_gpus_per_agent)"
        )
    bundle: dict[str, float] = {"CPU": max(cpus_per_agent, MIN_BUNDLE_CPUS)}
    if gpus > 0:
        bundle["GPU"] = gpus
    strategy = PLACEMENTS[placement] or ("PACK" if gpus > 0 else "SPREAD")
    return AgentPlacement(
        bundles=tuple(dict(bundle) for _ in range(num_agents)),
        strategy=strategy,
        gpus_per_agent=gpus,
        cpus_per_agent=cpus_per_agent,
    )


def host_groups(bundle_nodes: dict[int, str]) -> dict[int, tuple[str | None, tuple[int, ...]]]:
    """Each agent's (host group, host mates) from the Ray node its bundle landed on
    ({agent: Ray node id}): agents alone on their node have no group, like `LocalCluster`'s."""
    by_node: dict[str, list[int]] = {}
    for agent, node in sorted(bundle_nodes.items()):
        by_node.setdefault(node, []).append(agent)
    out: dict[int, tuple[str | None, tuple[int, ...]]] = {}
    for node, agents in by_node.items():
        for agent in agents:
            if len(agents) == 1:
                out[agent] = (None, ())
            else:
                out[agent] = (f"ray-{node[:12]}", tuple(a for a in agents if a != agent))
    return out
