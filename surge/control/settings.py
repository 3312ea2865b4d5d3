"""The control plane's settings: what `surge serve` (flags, config file) passes to the controller.

Plain frozen data, read by `control/controller.py` and handed to its collaborators
(`deployments.py`, `requests.py`, `autoscaler.py`, `copies.py`). Owned by control/.
"""

from dataclasses import dataclass, field
from pathlib import Path

from surge.config import EngineConfig, compile_decode_default
from surge.emulation import Emulation
from surge.errors import SurgeError
from surge.policy.multicast.group_block_bound import GroupBlockBound
from surge.runtime.security.tls import TlsConfig
from surge.runtime.transport import STALL_TIMEOUT_S, check_stall_timeout

DEFAULT_HOST_CACHE_BYTES = 4 << 30
"""Each node's host-cache budget unless `host_cache_gb` says otherwise."""


@dataclass(frozen=True)
class ControllerConfig:
    """Settings of the control plane."""

    state_dir: Path
    """Deployments database (`deployments.sqlite`) and the model registry (`registry/`)."""
    nodes: int = 4
    """Agents to start when no running agents are given (`LocalCluster` / `RayCluster`)."""
    link_gbps: float | None = None
    """Per-node link cap of started agents, Gbit/s (None: uncapped)."""
    egress_gbps: tuple[float, ...] | None = None
    """Each started agent's own egress cap, Gbit/s, one per node (overrides `link_gbps`;
    launcher "local" only). Agents report their caps; the multicast planner uses them."""
    ingress_gbps: tuple[float, ...] | None = None
    """Each started agent's own ingress cap, as `egress_gbps`."""
    host_groups: tuple[tuple[int, ...], ...] = ()
    """Started agents that share a machine (disjoint node ids; launcher "local"): a fast
    link of their own between them, and one network transfer per group in a multicast."""
    slots_per_node: int = 1
    """Instances (of any models) one node runs at once (its GPUs)."""
    host_cache_bytes: int = DEFAULT_HOST_CACHE_BYTES
    """Host memory of each node given to cached models."""
    host_keep_alive_s: float | None = 600.0
    """An unpinned host copy unused this long is evicted (None: only LRU)."""
    tick_s: float = 0.1
    """Autoscaler period; a request reaching a model at zero ticks at once."""
    max_num_seqs: int = 64
    """Sequences one engine runs at once: an instance's routing capacity."""
    preload_engine: bool = True
    """Started agents import the engine at start, not on their first instance."""
    fuse_projections: bool = True
    """Agents' engines fuse q/k/v and gate/up (`EngineConfig.fuse_projections`: faster
    decode; free for stores of version 3, which hold them fused; an older store's fresh
    instances pay a copy in their first steps — re-import it, or turn this off)."""
    compile_decode: bool = field(default_factory=compile_decode_default)
    """Agents' engines compile their decode steps (`EngineConfig.compile_decode`: faster
    decode once compiled, in a background thread while steps run eager; on by default)."""
    compile_quiet_s: float = EngineConfig.compile_quiet_s
    """Agents' `EngineConfig.compile_quiet_s`: a quiet spell before their compiles start."""
    compile_defer_max_s: float = EngineConfig.compile_defer_max_s
    """Agents' `EngineConfig.compile_defer_max_s`: how long requests may defer a compile."""
    heartbeat_s: float = 1.0
    """How often every live agent is asked for its status (`control/healing.py`)."""
    heartbeat_timeout_s: float = 5.0
    """An agent that has not answered in this long is frozen: treated as down and replaced
    (`policy/nodes/node_health.py`)."""
    stall_timeout_s: float = STALL_TIMEOUT_S
    """How long an agent, a peer of it or this controller may be silent (a link down, a host
    gone) before the connections to it fail and it counts as gone (`transport.STALL_TIMEOUT_S`,
    3 to 3600 s): the controller's own connections and every agent it starts (`surge node run
    --stall-timeout-s`); agents it joins (launcher "static") take theirs on their own command
    line."""
    max_agent_restarts: int = 5
    """Restarts in a row of a dead agent (launcher local) before its node stays down."""
    scale_out_timeout_s: float = 120.0
    """A scale-out not done in this long fails (its slots are released)."""
    group_block_bound: GroupBlockBound = field(default_factory=GroupBlockBound)
    """How long a gloo group's member waits for one block before giving the group up (the
    `nccl` system's scale-outs; `policy/multicast/group_block_bound.py`): a share of
    `scale_out_timeout_s` at most, validated where it is made."""
    launcher: str = "local"
    """Where agents run without `addresses`: "local" (processes here) or "ray" (actors)."""
    ray_address: str | None = None
    """With launcher "ray": a running Ray cluster; None starts a local one on loopback."""
    agent_host: str = "127.0.0.1"
    """With launcher "ray": where agents listen; "node-ip" is each Ray node's own address
    (a Ray cluster across hosts or network namespaces)."""
    ray_placement: str = "auto"
    """With launcher "ray": "pack" (fill a machine's GPUs first), "spread" (one agent per
    Ray node) or "auto" (pack agents holding a GPU, spread the others); one placement-group
    bundle per agent (`runtime/launch/ray_placement.py`)."""
    ray_gpus_per_agent: float | None = None
    """With launcher "ray": GPUs each agent actor reserves (None: one where the Ray cluster
    has GPUs, else none)."""
    cluster: str = "loopback"
    """With launcher "local": "loopback" (processes here) or "netns" (`NetnsCluster`: a
    network namespace per agent, tc-shaped links, a CPU quota each)."""
    agents: tuple[str, ...] = ()
    """With launcher "static": the running agents' "HOST:PORT" (or a DNS name resolving to
    several); `nodes` is how many to wait for."""
    agents_timeout_s: float = 120.0
    """With launcher "static": how long to wait for every agent to answer."""
    token_file: Path | None = None
    """With launcher "static": the file holding the agents' cluster token (None:
    `$SURGE_TOKEN`)."""
    tls: TlsConfig | None = None
    """TLS between this controller and the agents, and among them (`runtime/security/tls.py`; None:
    plain TCP, the token still proven, never sent). Started agents get the same files."""
    allow_plain: bool = False
    """With launcher "ray": agents may listen on a non-loopback `agent_host` without `tls`
    (frames in clear; the config's `allow_plain`)."""
    step_profile_dir: Path | None = None
    """Where the real engine's step profiles are kept (`runtime/step_profiles.py`): a
    deployment whose load monitor profiles its bounds (BlitzScale §5.3, `profile_bounds`)
    and runs unemulated is profiled here once per model, device and engine settings when it
    is deployed, and its bounds follow the profile (`control/emulation.deployment_profile`).
    None: no profiling; the bounds come from the host's estimates (`surge serve` sets
    `$SURGE_HOME/profiles` for its local agents)."""
    emulation: Emulation | None = None
    """GPU-time emulation of started agents (`surge serve --emulate`; launcher "local"):
    their rates, KV capacity and step times are the emulated cluster's (docs/emulation.md);
    `link_gbps`, per-node caps and host groups then come from its preset."""

    def __post_init__(self) -> None:
        EngineConfig(  # the agents' engines check these again; a bad one fails here, once
            compile_quiet_s=self.compile_quiet_s, compile_defer_max_s=self.compile_defer_max_s
        ).validate()
        try:
            check_stall_timeout(self.stall_timeout_s)
        except SurgeError as e:
            raise SurgeError(f"stall_timeout_s (--stall-timeout-s): {e}") from None
        for name in ("egress_gbps", "ingress_gbps"):
            caps = getattr(self, name)
            if caps is None:
                continue
            if len(caps) != self.nodes or any(not c > 0 for c in caps):
                raise SurgeError(f"{name} needs one cap > 0 per node ({self.nodes}), got {caps}")
        grouped = [n for g in self.host_groups for n in g]
        if len(grouped) != len(set(grouped)) or not all(0 <= n < self.nodes for n in grouped):
            raise SurgeError(
                f"host_groups must be disjoint node ids 0..{self.nodes - 1} "
                f"(got {self.host_groups})"
            )
        if self.launcher == "ray" and (self.egress_gbps or self.ingress_gbps or self.host_groups):
            raise SurgeError(
                "per-node caps and host groups need --launcher local; Ray agents take --link-gbps"
            )
