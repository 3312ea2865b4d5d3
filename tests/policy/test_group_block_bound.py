"""A gloo group member's per-block wait bound (`policy/multicast/group_block_bound.py`): floor +
factor x the largest block at the slowest reported cap, per hop (broadcast: ceil(log2 size);
ring: the rank's depth), never over the share of the scale-out's timeout; the share alone
where no member reported a cap (loopback: the bytes' speed is unknown). Settings validated
once, where they are made."""

import pytest

from surge.errors import SurgeError
from surge.policy.multicast.group_block_bound import (
    GroupBlockBound,
    GroupLink,
    block_timeout_s,
    group_link,
)
from surge.policy.multicast.topology import NodeLinks


def test_each_blocks_wait_is_bounded_by_its_expected_time_at_the_slowest_link() -> None:
    bound = GroupBlockBound()  # 4x, 2 s, a quarter of the scale-out's timeout
    slow = group_link([NodeLinks(10.0, 10.0), NodeLinks(10.0, 0.01), NodeLinks()], 1_250_000)
    assert slow == GroupLink(1_250_000, 0.01)  # 1 s per block
    assert block_timeout_s(slow, bound, "broadcast", 2, 3, 120.0) == 2 + 4 * 2 * 1.0
    assert block_timeout_s(slow, bound, "ring", 0, 3, 120.0) == 2 + 4 * 1.0
    assert block_timeout_s(slow, bound, "ring", 2, 3, 120.0) == 2 + 4 * 2 * 1.0
    assert block_timeout_s(slow, bound, "broadcast", 0, 256, 120.0) == 30.0  # the share caps it
    # 200 Gbit/s (BlitzScale's testbed), a 7B model's 0.5-GB block: the floor, ~2 s, not 30 s
    fast = group_link([NodeLinks(200.0, 200.0)] * 4, 500_000_000)
    assert block_timeout_s(fast, bound, "broadcast", 1, 4, 120.0) == pytest.approx(2.16)
    # no member reported a cap: the share
    assert block_timeout_s(group_link([NodeLinks()] * 4, 1), bound, "ring", 1, 4, 120.0) == 30.0
    assert block_timeout_s(None, bound, "broadcast", 1, 4, 120.0) == 30.0


def test_the_settings_move_the_bound() -> None:
    slow = GroupLink(1_250_000, 0.01)
    tight = GroupBlockBound(factor=1.5, floor_s=1.0, timeout_share=0.5)
    assert block_timeout_s(slow, tight, "broadcast", 1, 4, 120.0) == 1 + 1.5 * 2 * 1.0
    assert block_timeout_s(slow, tight, "broadcast", 1, 512, 10.0) == 5.0
    assert tight.cap_s(120.0) == 60.0


@pytest.mark.parametrize(
    "kwargs",
    [{"factor": 0.5}, {"floor_s": 0.0}, {"timeout_share": 0.0}, {"timeout_share": 1.5}],
)
def test_a_bad_bound_is_refused_once(kwargs: dict[str, float]) -> None:
    with pytest.raises(SurgeError, match="group block bound"):
        GroupBlockBound(**kwargs)
