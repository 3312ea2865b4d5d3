"""`surge.policy.paraserve.groups`: the fixed group and its fallback (fewer workers, down to
one: ParaServe §4.1.1 Alg. 1's last line), Alg. 1 with that fallback, and the groups of one
scale-out on one-worker servers."""

import pytest

from surge.policy.paraserve.group_plan import GroupRequest
from surge.policy.paraserve.groups import GroupsRequest, choose_group, fixed_group, plan_groups
from surge.policy.paraserve.placement import ServerNetwork
from surge.policy.paraserve.sizing import GpuServer, SizingSettings, StageTimes

BLOCKS = (100, 100, 100, 100, 100, 100)
MODEL_BYTES = sum(BLOCKS)


def _alg1(servers: tuple[int, ...], usable: int = MODEL_BYTES) -> GroupRequest:
    return GroupRequest(
        block_bytes=BLOCKS,
        servers=tuple(GpuServer(n, usable, 8.0, 100.0) for n in servers),
        times=StageTimes(0.0, 0.0, 0.001, 0.01, 0.001, 0.0),
        ttft_slo_s=100.0,
        tpot_slo_s=100.0,
        settings=SizingSettings(max_pipeline_size=4),
        networks=tuple(ServerNetwork(n, 8.0) for n in servers),
        now_s=0.0,
        model_id="m",
    )


def test_a_fixed_group_takes_the_first_candidates_and_fewer_when_fewer_are_free() -> None:
    g = fixed_group((5, 3, 9, 1, 7), BLOCKS, 4)
    assert g is not None and g.members == (5, 3, 9, 1)
    assert sorted(b for part in g.parts for b in part) == list(range(6))
    two = fixed_group((5, 3), BLOCKS, 4)
    assert two is not None and two.members == (5, 3) and len(two.parts) == 2
    assert fixed_group((5, 3, 9), (10, 10), 4).members == (5, 3)  # no more than the blocks
    assert fixed_group((), BLOCKS, 4) is None


def test_alg1_falls_back_to_the_fixed_group_when_it_finds_none() -> None:
    # every server fits the model: Alg. 1 answers (here one worker meets the loose SLOs)
    g = choose_group("alg1", (1, 2, 3), BLOCKS, 4, _alg1((1, 2, 3)))
    assert g is not None and len(g.members) == 1 and g.networks
    # no server fits even a quarter of the model: Alg. 1 has none, the fixed group stands in
    tiny = _alg1((1, 2, 3), usable=10)
    g = choose_group("alg1", (1, 2, 3), BLOCKS, 4, tiny)
    assert g is not None and g.members == (1, 2, 3) and not g.networks
    with pytest.raises(ValueError):
        choose_group("alg1", (1,), BLOCKS, 4)
    with pytest.raises(ValueError):
        choose_group("nope", (1,), BLOCKS, 4)


def test_the_groups_of_a_scale_out_take_the_pool_in_turn() -> None:
    def groups(leaders, spares, sizing="fixed"):
        pool = (*leaders, *spares)
        req = GroupsRequest(leaders, spares, sizing, 4, _alg1(pool))
        return [g.members for g in plan_groups(req)]

    assert groups((0,), (1, 2, 3, 4)) == [(0, 1, 2, 3)]
    # the second leader was taken by the first group: the next free servers form its group
    assert groups((0, 1), (2, 3, 4, 5)) == [(0, 1, 2, 3), (4, 5)]
    assert groups((0, 1), (2, 3)) == [(0, 1, 2, 3)]  # the nodes ran out: one group now
    assert groups((), (1, 2)) == []
    # Alg. 1: groups carry Alg. 2's state; each group names its workers `<model>/<group>/...`
    (g1, g2) = plan_groups(GroupsRequest((0, 1), (2,), "alg1", 4, _alg1((0, 1, 2))))
    assert set(g1.members).isdisjoint(g2.members)
    busy = {w.worker_id for n in g2.networks for w in n.workers}
    assert any(w.startswith("m/0/") for w in busy) and any(w.startswith("m/1/") for w in busy)
