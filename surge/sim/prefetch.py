"""ParaServe's node prefetcher (§5 Fig. 6(b)) in the simulator.

In: a pipeline group as it starts (`sim.groups.Groups`): its members' machines, their own
tiers and bytes, and the §6.1 predictor's number of workers to keep then. Out: for each
member `policy.paraserve.prefetch.plan_prefetch` names, once its own part has landed, the
rest of the model flows from the model store into its machine's host memory, counted in
Alg. 2's state as a background fetch (`placement.admit_background`); consolidation
(`sim.consolidation`) then loads a kept member's rest from there (host -> GPU, PCIe)
instead of the store. The runtime does the same (`runtime/scaleout/paraserve.py`).
§4.2's priority of inference packets over this fetch has nothing to act on here: the
simulator's stage hops are a constant (`stage_hop_s`), not flows on the links.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from surge.policy.paraserve.placement import ServerNetwork, admit_background, finish_worker
from surge.sim.world import World


@dataclass
class _Prefetch:
    machine: int
    landed: bool = False
    waiters: list[Callable[[], None]] = field(default_factory=list)


class Prefetches:
    """Background prefetches of the rest, by (group instance id, member index)."""

    def __init__(
        self,
        world: World,
        networks: dict[int, ServerNetwork],
        on_network_change: Callable[[], None],
    ) -> None:
        self.world = world
        self.networks = networks
        """Alg. 2's state per machine (owned by `Groups`)."""
        self.on_network_change = on_network_change
        self._held: dict[tuple[int, int], _Prefetch] = {}

    def start(self, group_id: int, index: int, machine: int, model: int, rest_bytes: int) -> None:
        """Member `index` of group `group_id` fetches `rest_bytes` into host memory now."""
        world = self.world
        entry = _Prefetch(machine)
        self._held[(group_id, index)] = entry
        world.result.prefetches += 1
        wid = f"prefetch@{group_id}/{index}"
        if machine in self.networks:
            self.networks[machine] = admit_background(
                self.networks[machine], wid, rest_bytes, world.loop.now_s
            )

        def landed() -> None:
            if machine in self.networks:
                self.networks[machine] = finish_worker(
                    self.networks[machine], wid, world.loop.now_s
                )
                self.on_network_change()
            entry.landed = True
            for waiter in entry.waiters:
                waiter()
            entry.waiters.clear()

        store = world.models[model].group.model_store
        world.net.start(world.state.store_to_host(machine, store), rest_bytes, landed)

    def load_rest(
        self,
        group_id: int,
        index: int,
        gpus: tuple[int, ...],
        nbytes: int,
        done: Callable[[], None],
    ) -> bool:
        """Load a prefetched rest into `gpus` from host memory once it has landed, then
        `done`; False if this member prefetched nothing (the caller fetches it)."""
        entry = self._held.pop((group_id, index), None)
        if entry is None:
            return False
        world = self.world
        world.result.prefetch_hits += 1
        left = [len(gpus)]

        def one() -> None:
            left[0] -= 1
            if left[0] == 0:
                done()

        def load() -> None:
            for g in gpus:
                world.net.start(world.state.host_to_gpu(g), nbytes / len(gpus), one)

        if entry.landed:
            load()
        else:
            entry.waiters.append(load)
        return True
