"""Multicast sources by the egress bandwidth they have left (`SystemConfig.
sources_by_bandwidth`, BlitzScale §5.1 Alg. 1: line 5 pops the source with the most
`CurrentBW_s`, line 2 prunes sources whose egress serves, line 10 pushes every target
back as a source; §5.3: the parameter pool holds GPU and host copies). Systems without
it keep ranking GPU copies by load."""

from dataclasses import replace

import pytest

from surge.errors import SurgeError
from surge.policy.startup import Copy, Destination, Source, StartupRequest, plan_startup
from surge.policy.systems import system_config

BLITZ = system_config("blitzscale")
LAMBDA = system_config("lambdascale")
ONE = (Destination(1, machine=1),)


def _sources(system, copies) -> tuple[Source, ...]:
    return plan_startup(StartupRequest(system, ONE, tuple(copies))).sources


def test_a_copy_already_sending_goes_after_a_free_one() -> None:
    assert BLITZ.sources_by_bandwidth and not LAMBDA.sources_by_bandwidth
    copies = (Copy(7, "gpu", outstanding=0, sending=1), Copy(8, "gpu", outstanding=5))
    assert _sources(BLITZ, copies) == (Source(8, "gpu"),)
    assert _sources(LAMBDA, copies) == (Source(7, "gpu"),)  # λScale: least loaded first


def test_the_pool_host_copy_sends_before_a_held_gpu_copy_not_before_a_free_one() -> None:
    host = Copy(9, "host", machine=0)
    held = Copy(7, "gpu", sending=1, machine=2)
    assert _sources(BLITZ, (held, host)) == (Source(9, "host"),)
    # §2: a deployed instance with its egress free sends, the host copy is not needed
    assert _sources(BLITZ, (replace(held, sending=0), host)) == (Source(7, "gpu"),)
    # the egress a P/D prefill's K/V holds counts as held too (Alg. 1 line 2)
    busy = Copy(7, "gpu", busy_egress=True, machine=0)
    assert _sources(BLITZ, (busy, host)) == (Source(9, "host"),)
    # without `sources_by_bandwidth`: host copies only when no instance holds the model
    plain = replace(BLITZ, sources_by_bandwidth=False)
    assert _sources(plain, (held, host)) == (Source(7, "gpu"),)


def test_without_the_prune_a_serving_copy_sends_as_any_other() -> None:
    """Alg. 1 line 2 alone (`prune_busy_sources`, Fig. 17's "+Plan" step): without it the
    K/V-sending prefill instance is ranked like any copy, by bandwidth then load."""
    kv = Copy(7, "gpu", busy_egress=True, outstanding=0, machine=0)
    idle = Copy(8, "gpu", outstanding=3, machine=1)
    host = Copy(9, "host", machine=2)
    assert BLITZ.prune_busy_sources
    assert _sources(BLITZ, (kv, idle)) == (Source(8, "gpu"),)
    assert _sources(BLITZ, (kv, host)) == (Source(9, "host"),)
    unpruned = replace(BLITZ, prune_busy_sources=False)
    assert _sources(unpruned, (kv, idle)) == (Source(7, "gpu"),)  # the least loaded
    assert _sources(unpruned, (kv, host)) == (Source(7, "gpu"),)  # a free GPU copy


def test_a_chain_tail_sends_when_every_complete_copy_is_held() -> None:
    held = (Copy(7, "gpu", sending=1), Copy(9, "host", machine=0, sending=2))
    tail = Copy(5, "loading", machine=3)
    assert _sources(BLITZ, (*held, tail)) == (Source(5, "loading"),)
    # a free complete copy goes first; a tail that forwards already goes after held ones
    assert _sources(BLITZ, (Copy(7, "gpu"), tail)) == (Source(7, "gpu"),)
    assert _sources(BLITZ, (*held, replace(tail, sending=3))) == (Source(7, "gpu"),)
    # systems that do not rank by bandwidth never send from an incomplete copy
    assert _sources(LAMBDA, (Copy(7, "gpu"), tail)) == (Source(7, "gpu"),)
    assert _sources(replace(BLITZ, sources_by_bandwidth=False), (*held, tail)) == (
        Source(7, "gpu"),
    )


def test_copies_that_leave_by_one_link_share_its_bandwidth() -> None:
    """A host copy whose link a GPU copy's multicast holds has no bandwidth left (§5.1
    Alg. 1's `CurrentBW_s` is the link's): a free chain tail or another link's host copy
    goes first. (Ranked per copy, every emulated §6.1 scale-out left by node 0's NIC.)"""
    gpu = Copy(0, "gpu", sending=1, machine=0, egress="nic0")
    beside = Copy(10, "host", machine=0, egress="nic0")
    tail = Copy(2, "loading", machine=2, egress="nic2")
    assert _sources(BLITZ, (gpu, beside, tail)) == (Source(2, "loading"),)
    other = Copy(11, "host", machine=3, egress="nic3")
    assert _sources(BLITZ, (gpu, beside, other)) == (Source(11, "host"),)
    # and the other way round: a GPU copy beside a sending host copy is held, not free
    idle = Copy(0, "gpu", machine=0, egress="nic0")
    sent = replace(beside, sending=1)
    assert _sources(BLITZ, (idle, sent, other)) == (Source(11, "host"),)
    # a host copy leaving by a link of its own (the simulator's machine NIC beside
    # per-GPU NICs) is free
    assert _sources(BLITZ, (gpu, replace(beside, egress="nic-out/0"), tail)) == (
        Source(10, "host"),
    )


def test_a_link_mates_kv_ranks_a_copy_later_but_never_prunes_it() -> None:
    """Alg. 1 line 2 prunes a source that itself sends K/V; a copy that only shares a
    NIC with a prefill instance is §5.1's corner case ("we only control the scale
    bandwidth usage"): it ranks after free copies, and still sends when it is the one
    copy not itself busy. So a P/D pool's idle decode instance stays the live-scaling
    source beside its machine's busy prefill one (machine-wide busy flags took it away
    and no cooperative batch ran)."""
    prefill = Copy(0, "gpu", busy_egress=True, machine=0, egress="nic0")
    decode = Copy(3, "gpu", machine=0, egress="nic0")
    far = Copy(12, "host", machine=4, egress="nic4")
    assert _sources(BLITZ, (prefill, decode, far)) == (Source(12, "host"),)
    assert _sources(BLITZ, (prefill, decode)) == (Source(3, "gpu"),)
    # per-GPU NICs (BlitzScale Table 1): machine mates do not share one
    own = replace(decode, egress="gnic3")
    assert _sources(BLITZ, (replace(prefill, egress="gnic0"), own, far)) == (Source(3, "gpu"),)


def test_bad_copies_are_refused() -> None:
    with pytest.raises(SurgeError, match="sending"):
        Copy(1, "gpu", sending=-1)
    with pytest.raises(SurgeError, match="tier"):
        Copy(1, "disk")
