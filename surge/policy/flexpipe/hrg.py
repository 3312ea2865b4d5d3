"""FlexPipe §7's Hierarchical Resource Graph (HRG): which slots a pipeline's new stages
may take, narrowest part of the hierarchy first.

In: the stages already placed (a refactoring keeps its first stages; a new group none),
the free slots (GPUs; in `surge serve` a node, its server its host group), an `HrgView`
(each slot's server, each server's rack, the recent scaling marks, the time) and
`HrgSettings`. Out: `hrg_domains` -> candidate slot sets, each able to take every new
stage, in the order `system.choose_stages` tries them (Eq. 6 and Eq. 13 then choose
inside one); `group_by_server` -> the placed slots reordered so that stages on one server
are adjacent. Both bodies pass their view to `choose_stages` (the simulator's machines,
the runtime's host groups). Pure and deterministic.

FlexPipe §7: "a Hierarchical Resource Graph (HRG) that orchestrates resources across
three critical levels: server (GPU memory, PCIe bandwidth), rack (network bandwidth), and
cluster (storage I/O). The HRG maintains annotated paths with scaling event markers ...
directs new instances toward available resources while avoiding paths with recent scaling
activities." So, for the stages of one pipeline (whose activations cross every boundary
between adjacent stages, each decode step):
1. server level: one server that takes all new stages. A refactoring stays on the server
   of its last kept stage (the new stages' neighbour); a new group takes an unmarked
   server before a marked one, a past host of the model before others (Eq. 13's score),
   then the fullest fit (fewest free slots: whole servers stay for larger groups);
2. rack level: the fewest servers of one rack (a refactoring: its own rack, its server
   first), unmarked, fullest and past hosts first;
3. cluster level: the fewest servers anywhere, in the same order;
4. every free slot (HRG never refuses what Eq. 6 alone would place).
A level that gains nothing (every server it uses gives one slot, none the refactoring's
own) is skipped, so Eq. 6 and Eq. 13 keep their choice among equals.
Marks are ours in form: the paper gives no window; a mark lasts `mark_window_s` (a
stage's load from host memory, §7, takes about that long).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from surge.errors import SurgeError


@dataclass(frozen=True)
class HrgSettings:
    """The HRG's knobs. Validated once at construction."""

    enabled: bool = True
    """Place by the HRG (False: Eq. 6 / Eq. 13 over every free slot, as before §7's HRG)."""
    mark_window_s: float = 2.0
    """How long a scaling event (a group placed or refactored) marks its servers (s, >= 0):
    their PCIe and network links are busy loading stages meanwhile."""

    def __post_init__(self) -> None:
        if not self.mark_window_s >= 0:
            raise SurgeError(f"mark_window_s must be >= 0 s (got {self.mark_window_s})")


@dataclass(frozen=True)
class ScalingMark:
    """A scaling event on a server's path (§7's "scaling event markers")."""

    server_id: int
    at_s: float


@dataclass(frozen=True)
class HrgView:
    """What the HRG sees of the cluster now."""

    server_of: Mapping[int, int]
    """Each slot's server (kept and free slots)."""
    rack_of: Mapping[int, int] = field(default_factory=dict)
    """Each server's rack; a server not named is in rack 0."""
    marks: tuple[ScalingMark, ...] = ()
    """Recent scaling events (older ones are ignored)."""
    past_hosts: Mapping[int, float] = field(default_factory=dict)
    """Eq. 13's score of each server that hosted the model (higher first)."""
    now_s: float = 0.0


def _marked(view: HrgView, settings: HrgSettings) -> frozenset[int]:
    return frozenset(
        m.server_id for m in view.marks if view.now_s - m.at_s <= settings.mark_window_s
    )


def _fewest_servers(
    servers: Sequence[int],
    by_server: Mapping[int, list[int]],
    need: int,
    marked: frozenset[int],
    view: HrgView,
    home: int | None = None,
) -> tuple[int, ...] | None:
    """The slots of the fewest `servers` (`home` first, then unmarked, fullest, past hosts
    of the model first) that hold `need` slots; None if they cannot, or if they gain
    nothing over any `need` slots: every server used gives one slot and none is `home`
    (e.g. `surge serve` nodes that share no host), so Eq. 6 / Eq. 13 choose freely."""
    ordered = sorted(
        servers,
        key=lambda s: (s != home, s in marked, -len(by_server[s]), -view.past_hosts.get(s, 0.0), s),
    )
    taken: list[int] = []
    for used, s in enumerate(ordered, start=1):
        taken += by_server[s]
        if len(taken) >= need:
            return tuple(taken) if used < need or home in ordered[:used] else None
    return None


def hrg_domains(
    kept: Sequence[int],
    free: Sequence[int],
    need: int,
    view: HrgView,
    settings: HrgSettings,
) -> tuple[tuple[int, ...], ...]:
    """Candidate slot sets for `need` new stages, narrowest first (module docstring); the
    last is always every free slot, and no set repeats."""
    free_t = tuple(free)
    if not settings.enabled or need < 1:
        return (free_t,)
    marked = _marked(view, settings)
    by_server: dict[int, list[int]] = {}
    for s in free_t:
        by_server.setdefault(view.server_of[s], []).append(s)
    rack = view.rack_of
    out: list[tuple[int, ...] | None] = []
    if kept:
        home = view.server_of[kept[-1]]
        if len(by_server.get(home, ())) >= need:
            out.append(tuple(by_server[home]))
        in_rack = [s for s in by_server if rack.get(s, 0) == rack.get(home, 0)]
        out.append(_fewest_servers(in_rack, by_server, need, marked, view, home))
        out.append(_fewest_servers(list(by_server), by_server, need, marked, view, home))
    else:
        fits = [s for s in by_server if len(by_server[s]) >= need]
        fits.sort(key=lambda s: (s in marked, -view.past_hosts.get(s, 0.0), len(by_server[s]), s))
        out += [tuple(by_server[s]) for s in fits]
        for r in sorted({rack.get(s, 0) for s in by_server}):
            in_rack = [s for s in by_server if rack.get(s, 0) == r]
            out.append(_fewest_servers(in_rack, by_server, need, marked, view))
        out.append(_fewest_servers(list(by_server), by_server, need, marked, view))
    out.append(free_t)
    unique: list[tuple[int, ...]] = []
    for d in out:
        if d is not None and set(d) not in [set(u) for u in unique]:
            unique.append(d)
    return tuple(unique)


def group_by_server(
    kept: Sequence[int], placed: Sequence[int], view: HrgView, same_size: bool
) -> tuple[int, ...]:
    """`placed` (the new stages' slots, in stage order) reordered so that slots of one
    server are adjacent, the last kept stage's server first: fewer activation hops cross
    a server. Only when every placed slot can take every stage (`same_size`); else as
    placed (Eq. 6 matched stage sizes to slots)."""
    if not same_size or len(placed) < 2:
        return tuple(placed)
    home = view.server_of[kept[-1]] if kept else view.server_of[placed[0]]
    order: list[int] = []  # servers by first appearance, home first
    for s in placed:
        server = view.server_of[s]
        if server not in order:
            order.append(server)
    if home in order:
        order.remove(home)
        order.insert(0, home)
    rank = {server: i for i, server in enumerate(order)}
    return tuple(sorted(placed, key=lambda s: (rank[view.server_of[s]], placed.index(s))))
