"""The pure policies the simulator (and later the control plane) call."""

import pytest

from surge.errors import SurgeError
from surge.policy.autoscale import InstanceLoad, PoolLoad, decide
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.copies.keepalive import CacheEntry, CacheSettings, admit, expired
from surge.policy.placement import MachineView, PlacementRequest, place
from surge.policy.router import Endpoint, route


def test_autoscale_scales_out_to_the_concurrency_target_counting_loading_instances():
    s = AutoscaleSettings(target_ongoing_requests=4, downscale_delay_s=2)
    busy = InstanceLoad(1, 4, loading=False, idle_since_s=None)
    loading = InstanceLoad(2, 0, loading=True, idle_since_s=None)
    d = decide(PoolLoad(10.0, queued=9, instances=(busy, loading)), s)
    assert d.desired == 4  # ceil(13 / 4)
    assert d.scale_out == 2
    assert decide(PoolLoad(0.0, 1, ()), s).scale_out == 1  # scale from zero


def test_autoscale_releases_longest_idle_after_the_delay_only():
    s = AutoscaleSettings(target_ongoing_requests=4, downscale_delay_s=2)
    a = InstanceLoad(1, 0, False, idle_since_s=5.0)
    b = InstanceLoad(2, 0, False, idle_since_s=3.0)
    c = InstanceLoad(3, 0, False, idle_since_s=6.5)
    assert decide(PoolLoad(7.0, 0, (a, b, c)), s).release == (2, 1)
    assert decide(PoolLoad(4.0, 0, (a, b, c)), s).release == ()
    kept = AutoscaleSettings(4, min_replicas=1, downscale_delay_s=2)
    assert len(decide(PoolLoad(100.0, 0, (a, b, c)), kept).release) == 2
    with pytest.raises(SurgeError):
        AutoscaleSettings(target_ongoing_requests=0)


def test_router_prefers_least_loaded_per_speed_and_skips_full():
    eps = [Endpoint(5, 2, 8), Endpoint(3, 2, 8), Endpoint(9, 0, 8, speed=0.1), Endpoint(1, 8, 8)]
    assert route(eps) == 3  # tie 5 vs 3 -> lowest id; the slow one scores 10
    assert route([Endpoint(1, 8, 8)]) is None


def test_keepalive_lru_evicts_oldest_unpinned_and_expires():
    s = CacheSettings(capacity_bytes=30, keep_alive_s=15)
    entries = [
        CacheEntry("a", 10, 1.0, pinned=True),
        CacheEntry("b", 10, 5.0),
        CacheEntry("c", 10, 3.0),
    ]
    d = admit(entries, CacheEntry("d", 15, 9.0), s)
    assert d.admit and d.evict == ("c", "b")
    assert admit(entries, CacheEntry("big", 100, 9.0), s).admit is False
    assert expired(entries, 19.0, s) == ("c",)
    assert expired(entries, 19.0, CacheSettings(30, None)) == ()


def test_placement_prefers_host_copy_then_spreads_over_nics():
    machines = [
        MachineView(0, (0, 1), has_host_copy=False, nic_load=0),
        MachineView(1, (2, 3), has_host_copy=True, nic_load=5),
        MachineView(2, (4, 5), has_host_copy=False, nic_load=0),
    ]
    got = place(machines, PlacementRequest(1, 4))
    # the host-copy machine is filled first, then one instance per idle NIC
    assert got == ((2,), (3,), (0,), (4,))
    assert place(machines, PlacementRequest(2, 5)) == ((2, 3), (0, 1), (4, 5))
    no_pref = place(machines, PlacementRequest(1, 1, prefer_host_copy=False))
    assert no_pref == ((0,),)
