"""`surge.policy.multicast.replan`: the live holder a receiver pulls a block from after a
failed pull (the runtime's multicast executor carries it out; the simulator has no failed
pulls)."""

from surge.policy.multicast.replan import replan_source


def test_a_failed_pull_goes_to_a_source_first_then_the_earliest_receiver() -> None:
    holds = [{0, 1}, {0, 1}, {1}, {1}, set()]  # plan nodes 0-1 are sources
    alive = [True] * 5
    assert replan_source(4, 1, failed_src=0, holds=holds, alive=alive, num_sources=2) == 1
    # both sources gone: the earliest receiver that holds it
    alive = [False, False, True, True, True]
    assert replan_source(4, 1, failed_src=2, holds=holds, alive=alive, num_sources=2) == 3
    # nobody live holds block 0 but the failed one: wait
    assert replan_source(4, 0, failed_src=2, holds=holds, alive=alive, num_sources=2) is None
    # never the receiver itself, never the source that failed it
    holds = [{0}, {0}, {0}]
    assert replan_source(1, 0, failed_src=0, holds=holds, alive=[True] * 3, num_sources=1) == 2
