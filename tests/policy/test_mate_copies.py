"""`policy.copies.mate_copies`: a destination opens a host mate's own device copy where both devices
share, and nowhere else."""

from surge.policy.copies.mate_copies import MateOpen, plan_mate_opens
from surge.policy.multicast.topology import NodeLinks

GPU_A = NodeLinks(host="a", shares_device=True)
GPU_B = NodeLinks(host="b", shares_device=True)
CPU_A = NodeLinks(host="a")  # a CPU device in the same machine: nothing to open
ALONE = NodeLinks(shares_device=True)


def test_a_destination_opens_its_mates_own_copy_and_only_its_mates() -> None:
    links = {0: GPU_A, 1: GPU_A, 2: GPU_B, 3: GPU_A, 4: GPU_B}
    assert plan_mate_opens([1, 2, 4], links, device_owners=[0]) == (MateOpen(1, 0),)
    # several owners in the group: the lowest id; every destination of the group opens it
    assert plan_mate_opens([1, 2], links, [3, 0, 4]) == (MateOpen(1, 0), MateOpen(2, 4))


def test_no_share_where_a_device_cannot_or_a_node_is_alone() -> None:
    assert plan_mate_opens([1], {0: GPU_A, 1: CPU_A}, [0]) == ()  # the destination's CPU
    assert plan_mate_opens([1], {0: CPU_A, 1: GPU_A}, [0]) == ()  # the owner's CPU
    assert plan_mate_opens([1], {0: ALONE, 1: ALONE}, [0]) == ()  # no host group
    assert plan_mate_opens([1], {1: GPU_A}, [0]) == ()  # the owner reported no links
    assert plan_mate_opens([1], {0: GPU_A, 1: GPU_A}, []) == ()  # no device copy yet
