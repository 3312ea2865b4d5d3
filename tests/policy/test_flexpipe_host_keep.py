"""FlexPipe §7: host copies kept after GPU eviction, and where a stage reads its blocks."""

from surge.policy.flexpipe.host_keep import keep_host_after_eviction, stage_sources
from surge.policy.systems import system_config


def test_only_flexpipe_keeps_and_only_what_the_host_cache_admits() -> None:
    flexpipe = system_config("flexpipe")
    assert keep_host_after_eviction(flexpipe, admitted=True)
    assert not keep_host_after_eviction(flexpipe, admitted=False)
    for other in ("lambdascale", "blitzscale", "paraserve"):
        assert not keep_host_after_eviction(system_config(other), admitted=True), other


def test_a_stage_loads_what_it_kept_from_host_and_only_the_rest_from_its_own_tier() -> None:
    kept = {0, 1, 2}
    assert stage_sources("remote", kept, [1, 2]) == (("host", (1, 2)),)  # the same cut
    assert stage_sources("remote", kept, [2, 3]) == (("host", (2,)), ("remote", (3,)))
    assert stage_sources("disk", set(), [0]) == (("disk", (0,)),)
    assert stage_sources("host", set(), [4, 5]) == (("host", (4, 5)),)  # a complete copy
    assert stage_sources("remote", kept, []) == ()
