"""One worker's weights from host memory or the model store into its GPUs.

In: the GPUs of one worker (a tensor-parallel group), the bytes, where from. Out: one
flow per GPU (an even share each), the cache hit/miss counted, the host cache touched,
`done()` when the last share lands. Used by local loads (`loading`) and by pipeline
groups' parallel fetches and consolidation (`groups`).
"""

from collections.abc import Callable

from surge.sim.host_cache import HostCache
from surge.sim.world import World


def fetch(
    world: World,
    cache: HostCache,
    model: int,
    gpus: tuple[int, ...],
    nbytes: float,
    from_host: bool,
    done: Callable[[], None],
    count: bool = True,
) -> None:
    """Move `nbytes` of `model` into `gpus` (see module docstring); `count`: record the
    load as a cache hit or miss."""
    machine = world.state.machine_of_gpu[gpus[0]].index
    if count:
        if from_host:
            world.result.cache_hits += 1
        else:
            world.result.cache_misses += 1
    if from_host:
        cache.touch(machine, model)
    store = world.models[model].group.model_store
    left = [len(gpus)]

    def one() -> None:
        left[0] -= 1
        if left[0] == 0:
            if not from_host:
                # the bytes have passed through host memory now, not when the load began:
                # a second load on this machine meanwhile must not read a copy still in
                # flight as a complete one
                cache.touch(machine, model)
            done()

    for g in gpus:
        path = world.state.host_to_gpu(g) if from_host else world.state.store_to_gpu(g, store)
        world.net.start(path, nbytes / len(gpus), one)
