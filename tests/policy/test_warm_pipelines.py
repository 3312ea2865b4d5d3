"""λScale §5 warm start: warm nodes load from their own host memory in rotated orders and
serve as one execution pipeline long before any of them holds the whole model."""

import pytest

from surge.errors import SurgeError
from surge.policy.loading import GoLocal, LoadingState, OpenPipeline, RetirePipeline
from surge.policy.warm_pipelines import loading_settings, plan_warm_groups, segments


def test_groups_split_the_blocks_into_segments_each_node_loading_its_own_first() -> None:
    (g,) = plan_warm_groups((7, 3, 9), 8)
    assert g.nodes == (7, 3, 9)
    assert [(s.node, s.first_block, s.last_block) for s in g.pipeline.stages] == [
        (0, 0, 1), (1, 2, 4), (2, 5, 7)
    ]  # fmt: skip
    assert g.load_orders[1] == (2, 3, 4, 5, 6, 7, 0, 1)
    assert all(sorted(o) == list(range(8)) for o in g.load_orders)
    assert g.pipeline.step == 3 and g.pipeline.until_step == 8
    # at most B nodes a group; sizes as equal as can be; one node or one block: none
    assert [len(x.nodes) for x in plan_warm_groups(tuple(range(5)), 4)] == [2, 3]
    assert plan_warm_groups((1,), 8) == () and plan_warm_groups((1, 2), 1) == ()
    with pytest.raises(SurgeError):
        segments(5, 4)


def test_the_group_serves_as_a_pipeline_after_one_segment_and_switches_when_whole() -> None:
    (g,) = plan_warm_groups((10, 11, 12, 13), 8)
    state = LoadingState(loading_settings(g, 8))
    actions = []
    for k in range(8):  # every node loads its next block at the same pace
        for j in range(4):
            got = state.arrive(j, g.load_orders[j][k])
            actions += [(k, a) for a in got]
    opened = [k for k, a in actions if isinstance(a, OpenPipeline)]
    assert opened == [1]  # two blocks each (a quarter of the model): the pipeline serves
    locals_ = [k for k, a in actions if isinstance(a, GoLocal)]
    assert locals_ == [7, 7, 7, 7]
    assert isinstance(actions[-1][1], RetirePipeline)  # after the last member is whole
