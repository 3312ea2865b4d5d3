"""One worker's weights from host memory or the model store into its GPUs.

In: the GPUs of one worker (a tensor-parallel group), the bytes, where from. Out: one
flow per GPU (an even share each), the cache hit/miss counted, the host cache touched,
`done()` when the last share lands. Used by local loads (`loading`) and by pipeline
groups' parallel fetches and consolidation (`groups`).

A load from the store passes through host memory (ServerlessLLM's loading path), so with
an `lru` host cache its model enters the cache when its bytes have landed, not when it
begins; a second load of the model on that machine meanwhile waits for that copy and then
loads from host memory (a hit: it never reads the store), as ServerlessLLM's store serves
one in-flight checkpoint to both; if the cache then refuses the copy (or cannot hold the
model at all: no waiting then) the waiting load reads the store itself. Before, the copy
counted as there from the start and the second load hit at PCIe speed while the first was
still fetching (issue 18).
"""

from collections.abc import Callable

from surge.policy.copies.host_copies import caches_after_load
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
    size = world.models[model].profile.total_bytes
    room = cache.settings[machine].capacity_bytes >= size
    caches = caches_after_load(world.system.host_cache) and room
    key = (machine, model)
    if not from_host and caches and key in cache.in_flight:

        def landed(admitted: bool) -> None:
            fetch(world, cache, model, gpus, nbytes, admitted, done, count)

        cache.in_flight[key].append(landed)
        return
    if count:
        if from_host:
            world.result.cache_hits += 1
        else:
            world.result.cache_misses += 1
    if from_host:
        cache.touch(machine, model)
    elif caches:
        cache.in_flight[key] = []
    store = world.models[model].group.model_store
    left = [len(gpus)]

    def one() -> None:
        left[0] -= 1
        if left[0] == 0:
            if not from_host:
                admitted = cache.touch(machine, model)
                for waiter in cache.in_flight.pop(key, []) if caches else []:
                    waiter(admitted)
            done()

    for g in gpus:
        path = world.state.host_to_gpu(g) if from_host else world.state.store_to_gpu(g, store)
        world.net.start(path, nbytes / len(gpus), one)
