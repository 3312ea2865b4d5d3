"""FlexPipe's routing and re-cutting decisions (`policy.router` `pack`,
`flexpipe_system.groups_to_refactor`): requests fill the fewest groups, and only groups
that serve (or will serve the next request) are refactored."""

from surge.policy.autoscale import AutoscaleSettings
from surge.policy.flexpipe_system import GroupView, groups_to_refactor, pipeline_target
from surge.policy.router import Endpoint, route
from surge.policy.systems import system_config


def _fill(endpoints: list[Endpoint], routing: str, count: int) -> list[int]:
    """Route `count` requests one by one; the ids chosen."""
    eps = {e.endpoint_id: e for e in endpoints}
    out = []
    for _ in range(count):
        chosen = route(list(eps.values()), routing)
        assert chosen is not None
        out.append(chosen)
        e = eps[chosen]
        eps[chosen] = Endpoint(
            e.endpoint_id, e.outstanding + 1, e.max_outstanding, e.speed, e.target
        )
    return out


def test_pack_fills_the_busiest_group_under_its_target_before_another() -> None:
    groups = [Endpoint(i, 0, 64, 1.0, 8.0) for i in range(4)]
    packed = _fill(groups, "pack", 12)
    assert packed == [0] * 8 + [1] * 4  # the fewest groups
    spread = _fill(groups, "least-loaded", 12)
    assert len(set(spread)) == 4  # the old rule uses every group


def test_pack_prefers_the_busier_group_and_spreads_once_all_are_at_target() -> None:
    groups = [Endpoint(0, 1, 64, 1.0, 8.0), Endpoint(1, 5, 64, 1.0, 8.0)]
    assert route(groups, "pack") == 1
    full = [Endpoint(0, 9, 64, 1.0, 8.0), Endpoint(1, 8, 64, 1.0, 8.0)]
    assert route(full, "pack") == 1  # both past target: least loaded
    assert route([Endpoint(0, 64, 64, 1.0, 8.0)], "pack") is None


def test_flexpipe_packs_and_its_target_scales_with_stages() -> None:
    assert system_config("flexpipe").routing == "pack"
    assert system_config("lambdascale").routing == "least-loaded"
    base = AutoscaleSettings(target_ongoing_requests=8.0)
    assert pipeline_target(base, 4) == 4 * pipeline_target(base, 1)


def test_only_groups_that_need_it_are_recut() -> None:
    groups = [
        GroupView(1, 4, 10),  # busy, at another count: re-cut
        GroupView(2, 8, 3),  # already at the chosen count
        GroupView(3, 4, 2, refactoring=True),  # being refactored
        GroupView(4, 4, 0),  # idle while others serve: draining
    ]
    assert groups_to_refactor(groups, 8, queued=0) == (1,)
    # requests waiting at the router: an idle group is about to serve, so it is cut too
    assert groups_to_refactor(groups, 8, queued=3) == (1, 4)


def test_when_all_groups_idle_the_next_to_serve_is_recut() -> None:
    groups = [GroupView(7, 8, 0), GroupView(3, 8, 0), GroupView(5, 1, 0)]
    assert groups_to_refactor(groups, 1, queued=0) == (3,)
    assert groups_to_refactor(groups, 8, queued=0) == ()
