"""P/D disaggregation in the simulator (BlitzScale §5.2, §6): `policy.blitzscale.pd` carried out.

What flows: a P/D model has one pool, as a `surge serve` deployment has one server; its
`PdPool` holds the roles. An instance that starts serving joins
(`policy.blitzscale.pd.role_for_new`, on the pool's load); new requests go to the instances
`policy.blitzscale.pd.routable` names (none while no prefill instance serves but one is
loading, `handoff.prefill_joining`); a prefilled request parks on its prefill instance
and waits here (`parked`, oldest first) until `policy.blitzscale.handoff.handoff_target`
names an instance to decode it (none while every decode instance is full, or while none
serves but one is loading, `decode_joining`; the source itself when none serves or
loads); `look` is the monitor's look (`policy.blitzscale.pd_mutation.look`: a mutation, carried out
here, and the monitor's wish for one more instance). The views are built as
the runtime builds them (`runtime/migration/pd_handoff.PdServing`): an instance's index is its
place in join order (its age), its requests count the ones parked on it (kept per instance
as requests park and leave: every routing decision reads them), its K/V ingress use is
reused while the same hand-offs are in its window, and an unchanged member's view is the
same object (`sim/load_views.py`); tests/sim/test_sim_speed.py checks each against the
plain count at every read.
Moving the K/V (a network transfer) is `sim/pools.py`'s; when to look is
`sim/scaling.py`'s. Owned by the simulator; decides nothing itself.
"""

from collections import deque
from collections.abc import Callable

from surge.policy.autoscale import RATE_WINDOW_S
from surge.policy.blitzscale import handoff, pd, pd_mutation, pd_release
from surge.sim.instance import Instance
from surge.sim.load_views import Snapshots
from surge.sim.request import SimRequest


class PdPool:
    """The P/D side of one model's pool."""

    def __init__(
        self,
        settings: pd.PdSettings,
        targets: pd.PdTargets,
        mutation: bool,
        clock: Callable[[], float],
    ) -> None:
        self.settings, self.targets, self.mutation = settings, targets, mutation
        self.clock = clock
        self.ingress: dict[int, deque[tuple[float, float]]] = {}
        """Instance id -> (when, link-seconds) of each hand-off sent to it: its bytes over
        the target's ingress bytes/s (`handed`)."""
        self.members: list[Instance] = []
        """Serving instances with a role, in join order (their index is their age)."""
        self.parked: deque[tuple[Instance, SimRequest]] = deque()
        """Prefilled requests waiting for decode room, oldest first, with their source."""
        self.parked_on: dict[int, int] = {}
        """Instance id -> requests parked on it, kept with `parked` (every routing decision
        reads each member's: counting `parked` per member was O(members x parked))."""
        self._handed_n: dict[int, int] = {}
        """Instance id -> hand-offs ever sent to it (with the ones left in its window: which
        ones those are)."""
        self._ingress_seen: dict[int, tuple[tuple[int, int], float]] = {}
        """Instance id -> ((hand-offs sent, left in its window), `ingress_usage` then)."""
        self._views: Snapshots[pd.PdInstance] = Snapshots(_pd_instance)
        """The members' snapshots (`sim/load_views.py`)."""
        self.last_mutation_s: float | None = None
        self.num_mutations = 0

    # ---- roles and routing ----------------------------------------------------------

    def join(self, inst: Instance, num_waiting: int) -> str:
        """`inst` starts serving, `num_waiting` requests queued at the router: its role
        (before it takes any request)."""
        inst.role = pd.role_for_new(self.load(num_waiting), self.targets, self.mutation)
        self.members.append(inst)
        return inst.role

    def leave(self, inst: Instance) -> list[SimRequest]:
        """`inst` stops serving: the requests parked on it, whose K/V goes with it."""
        if inst in self.members:
            self.members.remove(inst)
        self.ingress.pop(inst.id, None)
        self.parked_on.pop(inst.id, None)
        self._handed_n.pop(inst.id, None)
        self._ingress_seen.pop(inst.id, None)
        lost = [r for src, r in self.parked if src is inst]
        if lost:
            self.parked = deque((s, r) for s, r in self.parked if s is not inst)
        return lost

    def held(self, inst: Instance) -> int:
        """Requests `inst` holds as the runtime counts them: its engine's, those whose
        K/V is on its way to it, and those parked on it."""
        return inst.outstanding + inst.reserved + self.parked_on.get(inst.id, 0)

    def handed(self, inst: Instance, link_s: float) -> None:
        """A hand-off to `inst` started, `link_s` seconds of its ingress link's capacity."""
        self.ingress.setdefault(inst.id, deque()).append((self.clock(), link_s))
        self._handed_n[inst.id] = self._handed_n.get(inst.id, 0) + 1

    def ingress_usage(self, inst: Instance) -> float:
        """`policy.blitzscale.pd.ingress_usage` of the hand-offs to `inst`."""
        sent = self.ingress.get(inst.id, deque())
        now = self.clock()
        while sent and sent[0][0] < now - RATE_WINDOW_S:
            sent.popleft()
        # Every hand-off left is in the window, so the usage is their sum: the same
        # hand-offs (as many sent, as many left), the same sum as at the last look.
        key = (self._handed_n.get(inst.id, 0), len(sent))
        seen = self._ingress_seen.get(inst.id)
        if seen is not None and seen[0] == key:
            return seen[1]
        usage = pd.ingress_usage(sent, now)
        self._ingress_seen[inst.id] = (key, usage)
        return usage

    def views(self) -> tuple[pd.PdInstance, ...]:
        """The members as `policy.blitzscale.pd` sees them."""
        snaps = self._views
        snaps.prune(len(self.members))
        return tuple(
            snaps.get(
                m.id,
                (
                    k,
                    m.role,
                    self.held(m),
                    max(1, m.max_batch),
                    m.decode_tokens_per_s,
                    min(1.0, m.kv_tokens / m.kv_capacity_tokens) if m.kv_capacity_tokens else 0.0,
                    self.parked_on.get(m.id, 0),
                    self.ingress_usage(m),
                ),
            )
            for k, m in enumerate(self.members)
        )

    def routable(self, endpoints: list[Instance], instances: list[Instance]) -> list[Instance]:
        """The endpoints new requests may go to; none while no prefill instance serves but
        one of the pool's `instances` still loading joins as one (`pd.routable`). Execution
        pipelines have no role: they serve only when no instance prefills or comes (as in
        the runtime)."""
        views = self.views()
        coming = self.joining(instances, views, handoff.prefill_joining)
        keep = {self.members[k].id for k in pd.routable(views, coming)}
        chosen = [e for e in endpoints if e.id in keep]
        return chosen if chosen or coming else endpoints

    def releasable(self, release: tuple[int, ...]) -> tuple[int, ...]:
        """Of the autoscaler's `release` (instance ids), those to let go
        (`policy.blitzscale.pd_release.releasable`: the instances that stay keep a prefill
        and a decode one)."""
        index = {m.id: k for k, m in enumerate(self.members)}
        # an instance without a role (not a member) gets an index no member has
        asked = [index.get(iid, -1 - n) for n, iid in enumerate(release)]
        go = set(pd_release.releasable(asked, self.views()))
        return tuple(iid for iid, k in zip(release, asked, strict=True) if k in go)

    # ---- hand-off -------------------------------------------------------------------

    def park(self, src: Instance, req: SimRequest) -> None:
        """`src` prefilled `req`: it waits for a decode instance."""
        req.parked_s = self.clock()
        req.parked_without_decode = all(m.role != pd.DECODE for m in self.members)
        self.parked.append((src, req))
        self.parked_on[src.id] = self.parked_on.get(src.id, 0) + 1

    def next_handoff(
        self, instances: list[Instance]
    ) -> tuple[Instance, SimRequest, Instance] | None:
        """The oldest parked request and the instance to decode it, taken off the queue;
        None while it waits (every decode instance full, or none serving while one of the
        pool's `instances` still loads to join as one) or nothing waits."""
        if not self.parked:
            return None
        src, req = self.parked[0]
        index = self.members.index(src) if src in self.members else -1
        views = self.views()
        coming = self.joining(instances, views, handoff.decode_joining)
        chosen = handoff.handoff_target(index, views, coming)
        if chosen is None:
            return None
        self.parked.popleft()
        self.parked_on[src.id] -= 1
        return src, req, src if chosen == -1 else self.members[chosen]

    def joining(
        self,
        instances: list[Instance],
        views: tuple[pd.PdInstance, ...],
        role_joining: Callable[[pd.PdLoad, pd.PdTargets, int, bool], bool],
    ) -> bool:
        """Whether one of the pool's `instances` not serving yet (not a member: loading, or
        its engine starting) will join in a role (`role_joining`: `handoff.decode_joining`
        or `handoff.prefill_joining`)."""
        joining = sum(1 for i in instances if i not in self.members and not i.released)
        return role_joining(pd.PdLoad(views), self.targets, joining, self.mutation)

    # ---- the monitor ----------------------------------------------------------------

    def load(self, num_waiting: int, since_last_mutation_s: float = float("inf")) -> pd.PdLoad:
        """The pool as `policy.blitzscale.pd` sees it, `num_waiting` requests queued."""
        return pd.PdLoad(
            instances=self.views(),
            num_waiting=num_waiting,
            num_handoffs_waiting=len(self.parked),
            since_last_mutation_s=since_last_mutation_s,
        )

    def look(self, now_s: float, num_waiting: int) -> pd_mutation.PdLook:
        """One look of the monitor; a mutation it chooses is carried out here."""
        last = self.last_mutation_s
        load = self.load(num_waiting, float("inf") if last is None else now_s - last)
        seen = pd_mutation.look(load, self.settings, self.mutation)
        if seen.mutation is not None:
            self._mutate(seen.mutation, now_s)
        return seen

    def scale_out(self, now_s: float, num_waiting: int, count: int) -> int:
        """A scale-out of `count` instances was decided: the mutations
        `policy.blitzscale.pd_mutation.scale_out_mutations` names, carried out here (when the system
        mutates). How many."""
        if not self.mutation:
            return 0
        load = self.load(num_waiting)
        chosen = pd_mutation.scale_out_mutations(load, self.targets, count, self.settings)
        for m in chosen:
            self._mutate(m, now_s)
        return len(chosen)

    def _mutate(self, m: pd_mutation.Mutation, now_s: float) -> None:
        # §5.2: the instance keeps its weights and its requests; it decodes from now on
        self.members[m.index].role = pd.DECODE
        self.last_mutation_s = now_s
        self.num_mutations += 1


def _pd_instance(_iid: int, *fields) -> pd.PdInstance:
    """A member's `pd.PdInstance` from its fields in order (index first)."""
    return pd.PdInstance(*fields)
