"""Start-up: where each new instance's weights come from (λScale §5, FaaScale §5).

In: a `StartupRequest`: the system (`surge.policy.systems`), the destinations placement
chose (each with the best complete copy it holds itself: host, disk or none), and the
complete copies of the model elsewhere (on GPUs of serving instances, or in host memory).
Out: a `StartupPlan`:
- `local`: destinations that load the whole model from their own tier (a host copy is
  local and fast: warm-local; `local` systems load everything this way);
- `sources` and `receivers`: the multicast, plan node i = sources[i] for i < K, then the
  receivers. GPU copies and host copies both count as sources (FaaScale §5: one complete
  copy in host memory is a multicast source by itself), so K > 1 whenever two copies
  exist; sources are ordered GPU copies first (least loaded first), then host copies, and
  there are never more sources than receivers (more buy nothing) nor more than the
  system's `max_sources`, and one host copy per machine, none on a machine that already
  sends from a GPU copy (its NIC is the bottleneck);
  systems with `host_sources_when_hot` off use host copies only when no GPU copy exists
  (BlitzScale §2: multicast from deployed instances) or, with `sources_by_bandwidth`,
  none has its egress free (§5.1 Alg. 1: sources by the bandwidth they have left, so the
  pool's host copy goes before GPU copies whose egress K/V or earlier multicasts hold);
  the bandwidth a copy has left is its egress link's (`Copy.egress`: a node's host copy
  and its GPU copy may leave by one NIC);
- `cold_leader`: with no copy in memory anywhere, one receiver (a disk holder first, then
  the first in placement order)
  brings the model into its host tier from its disk or the registry, restoring the
  one-host-copy invariant (BlitzScale §5.1), and then leads the multicast as a host source;
  systems whose `cold_fallback` is `local` load every destination locally instead.
- `kind`: hot (a GPU copy exists), warm (a host copy exists) or cold.

When a started instance serves (`serving_at_s`): its engine start-up (`init_s`) follows
the weights, or runs beside their fetch and load where the system overlaps them
(ParaServe §5, Eq. 5).

ParaServe's pipeline group for a cold start is `policy/paraserve/group_plan.py`'s.

`surge serve`'s scale-out and the simulator both call these; neither chooses sources,
leaders or groups of its own. Pure and deterministic.
"""

from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.systems import SystemConfig

OWN_TIERS = ("host", "disk", "remote")
"""A destination's best complete copy of its own: host memory, local disk, or none (the
registry)."""
COPY_TIERS = ("gpu", "host", "loading")
"""Tiers a copy elsewhere can serve a multicast from: `loading` is an instance still
receiving an earlier multicast, which forwards each block as it lands (a chain's tail;
BlitzScale §5.1 Alg. 1 line 10 pushes every target back into the sources)."""
TIER_RANK = {"gpu": 0, "host": 1, "loading": 2}
"""At equal egress left, complete GPU copies send first (§2), then host copies, then
in-flight ones (they send no faster than they receive)."""
KINDS = ("hot", "warm", "cold")


@dataclass(frozen=True)
class Destination:
    """A node placement chose for a new instance."""

    node: int
    """Id the caller understands (runtime: agent node; simulator: its own id space)."""
    own_tier: str = "remote"
    """Its best complete copy: `host`, `disk` or `remote` (none)."""
    machine: int | None = None
    """The machine whose host memory and NIC it uses; None = a machine of its own."""

    def __post_init__(self) -> None:
        if self.own_tier not in OWN_TIERS:
            raise SurgeError(f"own_tier must be one of {OWN_TIERS} (got {self.own_tier!r})")


@dataclass(frozen=True)
class Copy:
    """A complete copy of the model that is not at a destination."""

    node: int
    """Who holds it (same id space as `Destination.node`)."""
    tier: str
    """`gpu` (a serving instance), `host` (host memory) or `loading` (an instance still
    receiving its multicast; used by `sources_by_bandwidth` systems only)."""
    outstanding: int = 0
    """Requests on the instance that holds a GPU copy (less loaded sources go first)."""
    machine: int | None = None
    """The machine it is on; None = a machine of its own."""
    busy_egress: bool = False
    """Its node's egress carries serving traffic (a P/D prefill instance's K/V): it sends
    only when no free copy is left (BlitzScale §5.1; the chain planner prunes it too)."""
    sending: int = 0
    """Multicasts it is a source of now: its egress is already shared, so copies sending
    less go first (BlitzScale §5.1 Alg. 1 line 5 pops the source with the most bandwidth
    left, `CurrentBW_s`; a copy whose egress an earlier scale-out holds has less)."""
    egress: str | None = None
    """The network link its blocks leave by (each body names its own links); copies that
    name the same one share its bandwidth: each ranks by what all of them send (§5.1
    Alg. 1's `CurrentBW_s` is what the link has left). None: a link of its own."""

    def __post_init__(self) -> None:
        if self.sending < 0 or self.outstanding < 0:
            raise SurgeError("a copy's outstanding and sending counts must be >= 0")
        if self.tier not in COPY_TIERS:
            raise SurgeError(f"copy tier must be one of {COPY_TIERS} (got {self.tier!r})")


@dataclass(frozen=True)
class StartupRequest:
    """One scale-out's start-up question. Validated at construction."""

    system: SystemConfig
    """The deployment's system: `load`, `max_sources`, `cold_fallback` are read."""
    destinations: tuple[Destination, ...]
    """The new instances' nodes, in placement order."""
    copies: tuple[Copy, ...] = ()
    """Complete copies elsewhere (a node may appear once per tier)."""

    def __post_init__(self) -> None:
        nodes = [d.node for d in self.destinations]
        if not nodes or len(set(nodes)) != len(nodes):
            raise SurgeError("a start-up needs one or more distinct destinations")
        if any(c.node in nodes for c in self.copies):
            raise SurgeError("a destination's own copy belongs in Destination.own_tier")


@dataclass(frozen=True)
class LocalLoad:
    """A destination loading the whole model from its own tier."""

    node: int
    source: str
    """`host`, `disk` or `remote`."""


@dataclass(frozen=True)
class Source:
    """A multicast source."""

    node: int
    tier: str
    """`gpu`, `host` or `loading`: where its blocks are read from (`loading`: a GPU that
    forwards each block once it has landed there)."""


@dataclass(frozen=True)
class StartupPlan:
    """Where every destination's weights come from."""

    kind: str
    """`hot`, `warm` or `cold` (what existed before this scale-out)."""
    local: tuple[LocalLoad, ...] = ()
    """Destinations loading by themselves (the cold leader included, from `host` once
    its host copy is in)."""
    sources: tuple[Source, ...] = ()
    """Multicast sources, plan nodes 0..K-1."""
    receivers: tuple[int, ...] = ()
    """Multicast destinations, plan nodes K..N-1."""
    cold_leader: LocalLoad | None = None
    """A destination that first brings the model into its host tier from `source`; it is
    then `sources`' host source (it is in `sources` already)."""

    @property
    def multicast_nodes(self) -> tuple[int, ...]:
        """Plan node i is this tuple's i-th node (sources first)."""
        return tuple(s.node for s in self.sources) + self.receivers


def _machine(node: int, machine: int | None) -> tuple[str, int]:
    return ("machine", machine) if machine is not None else ("node", node)


def plan_startup(request: StartupRequest) -> StartupPlan:
    """The start-up of `request` (see module docstring)."""
    system = request.system
    dests = request.destinations

    by_bandwidth = system.sources_by_bandwidth
    prune = system.prune_busy_sources

    def busy(c: Copy) -> bool:
        # Alg. 1 line 2 prunes a source that itself "sends outcast network" (K/V).
        return prune and c.busy_egress

    # A link's load: what every copy leaving by it sends (Alg. 1 line 5: `CurrentBW_s` is
    # what the link has left; per copy, a node's host copy looked free while its GPU copy
    # sent over the same NIC: six emulated §6.1 scale-outs all left by one NIC). A
    # link-mate's K/V takes bandwidth but prunes no one: §5.1 only "controls the scale
    # bandwidth" of a GPU sharing a NIC with a prefill, so it ranks later, never vetoed.
    load: dict[str, int] = {}
    for c in request.copies:
        if c.egress is not None:
            load[c.egress] = load.get(c.egress, 0) + c.sending + int(busy(c))

    def held(c: Copy) -> int:
        """Flows on its egress besides its own K/V (which `busy` prunes for)."""
        if c.egress is None:
            return c.sending
        return load[c.egress] - int(busy(c))

    # Ties go by machine, then id: ids are each body's own, machines mean the same in both.
    # Copies whose egress is busy go last (BlitzScale §5.1 Alg. 1 line 2, unless the
    # system does not prune); by bandwidth, copies whose egress earlier multicasts hold go
    # after free ones (Alg. 1 line 5).
    def order(c: Copy) -> tuple[bool, int, int, int, int]:
        machine = c.node if c.machine is None else c.machine
        return (busy(c), held(c) if by_bandwidth else 0, c.outstanding, machine, c.node)

    gpu = sorted((c for c in request.copies if c.tier == "gpu"), key=order)
    host = sorted((c for c in request.copies if c.tier == "host"), key=order)
    own_host = any(d.own_tier == "host" for d in dests)
    kind = "hot" if gpu else "warm" if host or own_host else "cold"
    if system.load != "multicast":
        # Local systems (and the ParaServe group's members, which `plan_group` splits) load
        # from their own best tier.
        return StartupPlan(kind, tuple(LocalLoad(d.node, d.own_tier) for d in dests))
    # BlitzScale §5.1 Alg. 1 takes sources from the parameter pool (GPU and host copies,
    # §5.3) by the bandwidth they have left: deployed instances send (§2) while one has its
    # egress free; once every one is busy (K/V, or an earlier scale-out's multicast) the
    # pool's host copy sends before them, rather than one more flow on a held NIC.
    free_gpu = [c for c in gpu if not (by_bandwidth and (busy(c) or held(c)))]
    use_host = system.host_sources_when_hot or not free_gpu
    warm_local = [d for d in dests if d.own_tier == "host" and use_host]
    receivers = [d for d in dests if d not in warm_local]
    local = [LocalLoad(d.node, "host") for d in warm_local]
    candidates = [Source(c.node, "gpu") for c in free_gpu]
    if use_host:
        # A warm-local destination serves its host copy to the others while it loads
        # (λScale §5); one host source per machine.
        hosts = [(c.node, c.machine) for c in host] + [(d.node, d.machine) for d in warm_local]
        # A machine already sending from a GPU copy has no egress left for its host copy
        # (by bandwidth: one that sends first, a free GPU copy).
        senders = free_gpu if by_bandwidth else gpu
        seen = {("machine", c.machine) for c in senders if c.machine is not None}
        for node, machine in hosts:
            if _machine(node, machine) not in seen:
                seen.add(_machine(node, machine))
                candidates.append(Source(node, "host"))
    candidates += [Source(c.node, "gpu") for c in gpu if c not in free_gpu]
    if by_bandwidth and receivers:
        # Free GPU copies, free host copies, free chain tails, then by egress held.
        tails = sorted((c for c in request.copies if c.tier == "loading"), key=order)
        candidates += [Source(c.node, "loading") for c in tails]
        left = {(c.node, c.tier): (busy(c), held(c)) for c in request.copies}
        candidates.sort(key=lambda s: (*left.get((s.node, s.tier), (False, 0)), TIER_RANK[s.tier]))
    leader: LocalLoad | None = None
    if receivers and not candidates:
        if system.cold_fallback == "local":
            local += [LocalLoad(d.node, d.own_tier) for d in receivers]
            return StartupPlan(kind, tuple(local))
        # A disk holder first, then placement order (stable `min`).
        first = min(receivers, key=lambda d: d.own_tier != "disk")
        leader = LocalLoad(first.node, first.own_tier)
        receivers.remove(first)
        local.append(LocalLoad(first.node, "host"))
        candidates = [Source(first.node, "host")]
    if not receivers:
        return StartupPlan(kind, tuple(local), cold_leader=leader)
    sources = candidates[: min(system.max_sources, len(receivers))]
    return StartupPlan(kind, tuple(local), tuple(sources), tuple(d.node for d in receivers), leader)


def serving_at_s(system: SystemConfig, launch_s: float, weights_in_s: float) -> float:
    """When an instance launched at `launch_s`, whose weights were all on its GPUs at
    `weights_in_s`, serves: `init_s` after the weights, or (`init_overlaps_load`,
    ParaServe §5.1-§5.2, Eq. 5) max(weights in, launch + `init_s`): the prefetcher
    fetches while the container and runtime start, the parameter manager loads while the
    libraries load, so only the longer of the two paths counts."""
    if system.init_overlaps_load:
        return max(weights_in_s, launch_s + system.init_s)
    return weights_in_s + system.init_s


def engine_start_wait_s(system: SystemConfig, launch_s: float, now_s: float) -> float:
    """How long an instance launched at `launch_s`, whose weights are all in at `now_s`,
    still waits for its engine start before it serves (`serving_at_s`; never negative):
    what the simulator charges, and the emulated runtime paces (`runtime/scaleout/local.py`
    `engine_start`)."""
    return max(0.0, serving_at_s(system, launch_s, now_s) - now_s)
