"""ParaServe §6.1 pipeline consolidation carried out: a serving group becomes instances.

In: a pipeline group that has just started serving (`sim.groups.Groups`), each member's
bytes. Out: kept members fetch the rest of the model (counted in Alg. 2's per-machine
state, `placement.admit_background`), or load it from host memory where their node
prefetched it (`sim.prefetch`, ParaServe §5), then become standalone instances; the
group retires (its requests move to them and recompute their KV cache) and the other
members' GPUs are freed. Decisions: how many to keep,
`surge.policy.paraserve.predictor.consolidate_group` (`predictor`: scale down to one
worker or up to several) or every member (`scale-up`); where a member holding a share of
one GPU becomes a full worker, `surge.policy.paraserve.gpu_share.consolidation_gpu` (its
own GPU grown, or a free one of its machine); a whole-GPU member takes more GPUs of its
machine when the whole model needs them.
"""

from collections.abc import Callable
from dataclasses import dataclass

from surge.policy.paraserve.gpu_share import consolidation_gpu
from surge.policy.paraserve.placement import ServerNetwork, admit_background, finish_worker
from surge.policy.paraserve.predictor import consolidate_group
from surge.sim.gpus import Gpus
from surge.sim.instance import Instance
from surge.sim.instance_factory import tp_for
from surge.sim.placement import Placement
from surge.sim.pools import Pool, Requests
from surge.sim.prefetch import Prefetches
from surge.sim.world import World


class Consolidation:
    """Consolidates the run's pipeline groups."""

    def __init__(
        self,
        world: World,
        requests: Requests,
        gpus: Gpus,
        networks: dict[int, ServerNetwork],
        fetch: Callable[[Pool, tuple[int, ...], int, Callable[[], None], bool], None],
        make_endpoint: Callable[[Pool, Placement, bool], Instance],
        ready: Callable[[Pool, Instance, float], None],
        on_network_change: Callable[[], None],
        prefetches: Prefetches,
    ) -> None:
        self.world = world
        self.prefetches = prefetches
        """The members' background prefetches of the rest (`sim.prefetch`)."""
        self.requests = requests
        self.gpus = gpus
        self.networks = networks
        """Alg. 2's state per machine (owned by `Groups`; background fetches join it)."""
        self.fetch = fetch
        """Bytes into GPUs from host memory or the model store (`Groups._fetch`)."""
        self.make_endpoint = make_endpoint
        self.ready = ready
        self.on_network_change = on_network_change
        """Called when a background fetch ends (pools Alg. 2 refused decide again)."""

    def keep(self, pool: Pool, size: int) -> int:
        """Members of a group of `size` that become instances (§6.1, on the pool's
        arrivals and queue: `policy.paraserve.predictor.consolidate_group`)."""
        now_s = self.world.loop.now_s
        return consolidate_group(
            self.world.system, pool.arrivals_s, now_s, len(pool.queue), size
        ).keep

    def start(
        self,
        pool: Pool,
        group: Instance,
        member_bytes: list[int],
    ) -> None:
        """ParaServe §6.1: kept members fetch the rest and become instances. A member
        holding a share of one GPU grows into the whole of it, or moves to a free GPU of
        its machine (its part copied there), where `consolidation_gpu` says."""
        world = self.world
        state = world.state
        slot = world.models[pool.model]
        full_tp = tp_for(slot.group, slot.profile.total_bytes, world.settings.kv_memory_fraction)
        if full_tp is None:
            return  # no machine of the group holds the whole model: it serves as a group
        wanted = self.keep(pool, len(member_bytes))
        kept: list[_Kept] = []
        for i, w in enumerate(group.placement.workers):
            if len(kept) == wanted:
                break
            machine = state.machines[state.machine_of_gpu[w[0]].index]
            share = group.placement.share(i)
            if share < 1.0:
                target = consolidation_gpu(w[0], share, state.free_shares_on(machine))
                if target is None:
                    continue  # neither its GPU nor a free one of its machine has room
                if target == w[0]:
                    self.gpus.take_share(target, 1.0 - share)
                    kept.append(_Kept(i, w, (), share, target))
                else:
                    self.gpus.take((target,))
                    kept.append(_Kept(i, w, (target,), share, target))
                continue
            extra = state.free_on(machine)[: max(full_tp - len(w), 0)]
            if len(w) + len(extra) < full_tp:
                continue  # this member's machine cannot hold the whole model
            self.gpus.take(extra)
            kept.append(_Kept(i, w, extra, 1.0, None))
        if not kept:
            return
        # The group stays releasable meanwhile: if the autoscaler gives it back first,
        # the consolidation is abandoned (`_switch` returns what the kept members took).
        left = [sum(2 if k.moves else 1 for k in kept)]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                self._switch(pool, group, kept)

        total = slot.profile.total_bytes
        for k in kept:
            rest = total - member_bytes[k.index]
            if k.moves:
                # its part goes from its old GPU to the new one inside the machine
                world.net.start(
                    state.gpu_to_gpu(k.gpus[0], k.extra[0]), member_bytes[k.index], one_done
                )
            gpus = k.extra if k.moves else k.gpus + k.extra
            # ParaServe §5 Fig. 6(b): a member whose node prefetched the rest loads it from
            # host memory (once landed); the others fetch it now
            if not self.prefetches.load_rest(group.id, k.index, gpus, rest, one_done):
                done = self._background(group.id, k, rest, one_done)
                self.fetch(pool, gpus, rest, done, count=False)

    def _background(
        self, group_id: int, k: "_Kept", rest: int, done: Callable[[], None]
    ) -> Callable[[], None]:
        """Alg. 2's state counts a kept member's fetch of the rest on its machine's NIC
        (`placement.admit_background`) until it lands; `done` then."""
        world = self.world
        machine = world.state.machine_of_gpu[k.gpus[0]].index
        if machine not in self.networks:  # no Alg. 2 state: `fixed` groups
            return done
        wid = f"consolidate@{group_id}/{k.index}"
        self.networks[machine] = admit_background(
            self.networks[machine], wid, rest, world.loop.now_s
        )

        def landed() -> None:
            self.networks[machine] = finish_worker(self.networks[machine], wid, world.loop.now_s)
            done()
            self.on_network_change()

        return landed

    def _switch(self, pool: Pool, group: Instance, kept: list["_Kept"]) -> None:
        world = self.world
        if group.released:
            for k in kept:
                if k.grows_in_place:
                    self.gpus.give_back_share(k.gpus[0], 1.0 - k.share)
                else:
                    self.gpus.give_back(k.extra)
            return
        by_index = {k.index: k for k in kept}
        machine_of = world.state.machine_of_gpu
        for i, w in enumerate(group.placement.workers):
            k = by_index.get(i)
            share = group.placement.share(i)
            if k is None or k.moves:
                if share < 1.0:
                    self.gpus.give_back_share(w[0], share)
                else:
                    self.gpus.give_back(w)
            elif k.grows_in_place:
                self.gpus.make_whole(w[0])  # its share and what it grew into: all of it
        pool.instances.remove(group)
        group.released = True
        for k in kept:
            gpus = k.extra if k.moves else k.gpus + k.extra
            inst = self.make_endpoint(pool, Placement((gpus,), machine_of[gpus[0]].index), False)
            pool.instances.append(inst)
            self.ready(pool, inst, 0.0)
        world.event(pool.model, pool.role, "consolidate", len(kept))
        self.requests.requeue(pool, group.drain())


@dataclass(frozen=True)
class _Kept:
    """A member §6.1 keeps: it becomes a standalone instance."""

    index: int
    """Its stage in the group."""
    gpus: tuple[int, ...]
    """What it holds in the group."""
    extra: tuple[int, ...]
    """Whole GPUs it took to hold the whole model (its new GPU when it moves)."""
    share: float
    """The share of its GPU it holds in the group (1.0: whole GPUs)."""
    target: int | None
    """With a share: the GPU it becomes a full worker on (its own, or the one it moves
    to)."""

    @property
    def grows_in_place(self) -> bool:
        """It takes the rest of its own GPU."""
        return self.share < 1.0 and self.target == self.gpus[0]

    @property
    def moves(self) -> bool:
        """It moves to a free GPU of its machine (its part copied there)."""
        return self.share < 1.0 and self.target != self.gpus[0]
