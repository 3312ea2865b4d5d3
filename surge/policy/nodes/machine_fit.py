"""Does a local cluster fit the machine it is started on? Pure: the ask and the machine's
facts in, the problems out (each a sentence with the numbers and the fix).

`surge serve` (launcher local) gathers the facts (`/proc/meminfo`, the CPUs it may use,
`/dev/shm`'s size) and refuses to start when a problem is found, unless
`--allow-overcommit` (issue 36: `--nodes 1000` on a 2-core, 24 GB machine started 1,000
agents until the kernel's OOM killer took an agent and another user's server).
"""

from dataclasses import dataclass

AGENT_BASE_BYTES = 256 << 20
"""Memory of one idle agent with its engine loaded (measured: 160-180 MB private, 300 MB
RSS on CPU; a serving agent holds 420 MB and more): the floor an agent costs."""
CONTROLLER_BYTES = 512 << 20
"""The controller and HTTP server themselves."""
MAX_AGENTS_PER_CPU = 16
"""Agents per usable CPU beyond which the machine only thrashes (each agent's engine loop,
transfers and heartbeats need some CPU time every tick)."""


@dataclass(frozen=True)
class MachineFacts:
    """What the machine offers, read when `surge serve` starts."""

    cpus: int
    """CPUs this process may run on."""
    available_memory_bytes: int
    """`MemAvailable`: what can be allocated without swapping."""
    shm_total_bytes: int
    """Size of `/dev/shm`, where host copies of models live."""


@dataclass(frozen=True)
class ClusterAsk:
    """What the serve settings would start and reserve on this machine."""

    nodes: int
    host_cache_bytes: int
    """Each node's host-cache budget (shared memory)."""


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def machine_problems(ask: ClusterAsk, facts: MachineFacts) -> list[str]:
    """Every way `ask` does not fit `facts` (empty: it fits)."""
    problems = []
    need = CONTROLLER_BYTES + ask.nodes * AGENT_BASE_BYTES
    if need > facts.available_memory_bytes:
        fit = max(0, (facts.available_memory_bytes - CONTROLLER_BYTES) // AGENT_BASE_BYTES)
        problems.append(
            f"--nodes {ask.nodes} needs at least {_gb(need)} of memory ({ask.nodes} agents x "
            f"{AGENT_BASE_BYTES / 1e6:.0f} MB + the controller) but this machine has "
            f"{_gb(facts.available_memory_bytes)} available: use --nodes {fit} or fewer"
        )
    most = facts.cpus * MAX_AGENTS_PER_CPU
    if ask.nodes > most:
        problems.append(
            f"--nodes {ask.nodes} is more than {MAX_AGENTS_PER_CPU} agents per CPU "
            f"({facts.cpus} CPUs here): use --nodes {most} or fewer"
        )
    if ask.host_cache_bytes > facts.shm_total_bytes:
        problems.append(
            f"host_cache_gb {ask.host_cache_bytes / (1 << 30):g} is larger than /dev/shm "
            f"({_gb(facts.shm_total_bytes)}), where host copies live: lower host_cache_gb"
        )
    return problems
