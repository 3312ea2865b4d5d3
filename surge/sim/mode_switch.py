"""λScale §4.4 mode switch in the simulator: where a retired pipeline's requests go.

In: the unfinished requests of an execution pipeline that retired (its members all hold
the whole model) and its member instances. Out: each request handed to the member
`surge.policy.loading.spread_evenly` names — held until that member's instance serves
(`hand_over`, called by `Loader.ready`) — or, where no member has room (and under P/D, or
with every member gone), back at the head of the pool's queue. The runtime carries out the
same spread in `Server.retire(name, spread_over=...)`. Owned by `LoadingActions`.
"""

from surge.policy.loading import spread_evenly
from surge.sim.instance import Instance
from surge.sim.pools import Pool, Requests
from surge.sim.request import SimRequest


class SpreadRequests:
    """Retired pipelines' requests on their way to their members."""

    def __init__(self, requests: Requests) -> None:
        self.requests = requests
        self.spread: dict[int, list[SimRequest]] = {}
        """Per member instance id: the requests held for it until it serves."""

    def spread_retired(self, pool: Pool, reqs: list[SimRequest], members: list[Instance]) -> None:
        """A retired pipeline's requests (admission order) go to its members as
        `spread_evenly` says (λScale §4.4), each held until its member serves; those no
        member has room for, and all of them under P/D or with every member gone, go to
        the head of the queue (as the runtime's `Server.retire` does)."""
        members = [m for m in members if not m.released]
        if not members or pool.role != "both":
            self.requests.requeue(pool, reqs)
            return
        reqs = sorted(reqs, key=lambda r: r.id)
        loads = tuple(m.outstanding + m.reserved + len(self.spread.get(m.id, ())) for m in members)
        where = spread_evenly(len(reqs), loads, tuple(m.max_batch for m in members))
        for req, i in zip(reqs, where, strict=True):
            if i is not None:
                self.spread.setdefault(members[i].id, []).append(req)
        for m in members:
            if m.serving:
                self.hand_over(pool, m)
        self.requests.requeue(pool, [r for r, i in zip(reqs, where, strict=True) if i is None])

    def hand_over(self, pool: Pool, inst: Instance) -> None:
        """`inst` serves (or was given back): the requests a mode switch spread onto it
        start there (or, given back, go to the head of the queue)."""
        held = self.spread.pop(inst.id, [])
        if not held:
            return
        if inst.released:
            self.requests.requeue(pool, held)
        else:
            inst.submit_many(held)
