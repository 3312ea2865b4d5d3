"""ParaServe's node prefetcher plan (§5 Fig. 6(b)): who fetches the rest early, in order."""

import pytest

from surge.errors import SurgeError
from surge.policy.paraserve.prefetch import plan_prefetch

MEMBERS = (4, 7, 9)
PARTS = ((0, 1), (2,), (3, 4))


def test_scale_up_prefetches_the_rest_on_every_cold_member_after_its_part() -> None:
    plans = plan_prefetch(MEMBERS, PARTS, 5, ("remote", "disk", "host"), "scale-up", 1)
    assert [(p.node, p.own, p.rest) for p in plans] == [
        (4, (0, 1), (2, 3, 4)),
        (7, (2,), (0, 1, 3, 4)),
        (9, (3, 4), ()),  # its host copy holds the rest already
    ]


def test_predictor_prefetches_only_on_the_members_it_predicts_to_keep() -> None:
    tiers = ("remote",) * 3
    keep_two = plan_prefetch(MEMBERS, PARTS, 5, tiers, "predictor", 2)
    assert [bool(p.rest) for p in keep_two] == [True, True, False]
    keep_one = plan_prefetch(MEMBERS, PARTS, 5, tiers, "predictor", 1)
    assert [bool(p.rest) for p in keep_one] == [True, False, False]
    # no consolidation, or a single worker (its part is the model): nothing beyond the parts
    assert not any(p.rest for p in plan_prefetch(MEMBERS, PARTS, 5, tiers, "none", 3))
    (alone,) = plan_prefetch((4,), ((0, 1, 2),), 3, ("remote",), "scale-up", 1)
    assert alone.own == (0, 1, 2) and alone.rest == ()


def test_bad_input_is_refused() -> None:
    with pytest.raises(SurgeError, match="one part and one own tier per member"):
        plan_prefetch(MEMBERS, PARTS[:2], 5, ("remote",) * 3, "scale-up", 1)
    with pytest.raises(SurgeError, match="predicted_keep"):
        plan_prefetch(MEMBERS, PARTS, 5, ("remote",) * 3, "predictor", -1)
