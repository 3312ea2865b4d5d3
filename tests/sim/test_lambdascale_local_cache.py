"""λScale keeps best-effort local host copies beside its one registered replica.

λScale §7.5: "As ServerlessLLM, λScale supports best-effort local host memory caching but
falls back to λPipe multicast if the requested model is not in host memory" (§7.3: "λScale
is configured to utilize local memory caching similarly to ServerlessLLM"); FaaScale §5: a
scale-out needs only "one complete replica in RDMA-accessible registered memory somewhere
in the cluster". So λScale's `host_cache` is `pinned-lru`: the pinned replica, and an LRU
copy wherever one of its instances ran (`policy.copies.host_copies.caches_after_load`).
Until 2026-11-29 it was `pinned-one` (the replica only), and every later start on a node
that had served the model multicast it again.
"""

from dataclasses import replace

import numpy as np

from surge.policy.copies.host_copies import NodeHostCache, copy_after_load, kept_copies
from surge.policy.copies.keepalive import CacheEntry, CacheSettings
from surge.policy.systems import system_config
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.request import make_trace

GIB = 1 << 30


def test_lambdascale_keeps_its_replica_and_an_lru_copy_where_it_loaded() -> None:
    mode = system_config("lambdascale").host_cache
    settings = CacheSettings(100 * GIB)
    caches = [NodeHostCache(n, ()) for n in range(3)]
    # one pinned registered replica, as before
    assert len(kept_copies(mode, caches, settings, ())) == 1
    # and a node whose instance loaded (or released) the model keeps a copy
    entry = CacheEntry("m", 26 * GIB, 5.0)
    assert copy_after_load(mode, (), entry, settings).admit
    # BlitzScale's O(1) pool keeps the replica only
    assert not copy_after_load("pinned-one", (), entry, settings).admit


def _two_bursts(host_cache: str | None):
    """13B on Testbed1: 40 requests at 0, the instances released, 40 more at 200 s."""
    arrivals = np.r_[np.zeros(40), np.full(40, 200.0)]
    trace = make_trace("two", arrivals, np.full(80, 256), np.full(80, 16))
    cfg = system_config("lambdascale")
    if host_cache is not None:
        cfg = replace(cfg, host_cache=host_cache)
    settings = SimSettings("lambdascale-testbed1", ("llama2-13b",), cfg.name, max_batch=8)
    return Simulation(trace, settings, system=cfg).run()


def test_a_later_start_on_a_node_that_served_loads_from_its_own_host_memory() -> None:
    now = _two_bursts(None)
    before = _two_bursts("pinned-one")
    # the second burst's instances start from the copies the first burst's left behind
    assert now.cache_hits > before.cache_hits, (now.cache_hits, before.cache_hits)
    assert now.network_loads < before.network_loads, (now.network_loads, before.network_loads)
