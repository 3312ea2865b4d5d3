"""`surge.policy.blitzscale.handoff`: which decode instance adopts a prefilled request, and
when it waits (BlitzScale §2.1, §4, §5.2)."""

from surge.policy.blitzscale.handoff import (
    decode_joining,
    decodes_where_prefilled,
    handoff_target,
    prefill_joining,
)
from surge.policy.blitzscale.pd import DECODE, PREFILL, PdInstance, PdLoad, PdTargets


def _i(index, role, outstanding=0, capacity=8) -> PdInstance:
    return PdInstance(index, role, outstanding, capacity)


def test_handoffs_go_to_the_least_loaded_decode_instance_with_room() -> None:
    xs = [_i(0, PREFILL, 3), _i(1, DECODE, 5), _i(2, DECODE, 2), _i(3, DECODE, 2)]
    assert handoff_target(0, xs) == 2  # least loaded, ties to the oldest
    assert handoff_target(0, xs, decode_coming=True) == 2  # one serves: it adopts
    full = [_i(0, PREFILL, 3), _i(1, DECODE, 8), _i(2, DECODE, 8)]
    assert handoff_target(0, full) is None  # every decode full: the K/V waits
    assert decodes_where_prefilled(DECODE) and decodes_where_prefilled(None)
    assert not decodes_where_prefilled(PREFILL)


def test_a_prefilled_request_waits_for_the_decode_instance_still_loading() -> None:
    """§2.1: P/D serves "the prefill and decode phases of a request" on two replicas; §5.2: a
    decode instance cannot serve while it loads. So while the decode instance a P/D pool
    starts beside its first prefill one still loads (`serving_floor`), the K/V waits parked
    on the prefill instance; only with no decode instance serving or loading (a deployment
    held to one instance) does it decode in place. On main it decoded in place."""
    alone = PdLoad((_i(0, PREFILL, 1),))
    coming = decode_joining(alone, PdTargets(), 1, mutation=True)
    assert coming
    assert handoff_target(0, alone.instances, coming) is None  # waits for it
    none = decode_joining(alone, PdTargets(), 0, mutation=True)
    assert handoff_target(0, alone.instances, none) == 0  # nobody decodes or comes: in place


def test_which_joining_instance_decodes_follows_role_for_new() -> None:
    alone = PdLoad((_i(0, PREFILL, 1),))
    for mutation in (True, False):
        assert decode_joining(alone, PdTargets(), 1, mutation)
        assert not decode_joining(alone, PdTargets(), 0, mutation)
        # two prefill instances wanted: the first to join prefills, the second decodes
        assert not decode_joining(alone, PdTargets(prefill=2), 1, mutation)
        assert decode_joining(alone, PdTargets(prefill=2), 2, mutation)
    # past the targets a mutating system's new instances prefill (§5.2)
    both = PdLoad((_i(0, PREFILL, 1), _i(1, DECODE, 8)))
    assert not decode_joining(both, PdTargets(), 3, mutation=True)


def test_a_loading_instance_joins_as_prefill_when_none_prefills() -> None:
    """`prefill_joining` (what `pd.routable` waits for): a pool of decode instances alone
    gets a prefill instance from its next joiner (below the prefill target)."""
    alone = PdLoad((PdInstance(0, DECODE, 1, 4), PdInstance(1, DECODE, 1, 4)))
    for mutation in (True, False):
        assert prefill_joining(alone, PdTargets(), 1, mutation)
        assert not prefill_joining(alone, PdTargets(), 0, mutation)
        assert not decode_joining(alone, PdTargets(), 1, mutation)
