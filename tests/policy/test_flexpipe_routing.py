"""FlexPipe's routing and re-cutting decisions (`policy.router` `pack`,
`groups.group_refactors`): requests fill the fewest groups, coarse ones first, an
overfull group takes no more; busy groups split while requests wait and merge to what
holds their load while none does; idle (draining) groups are left alone."""

from dataclasses import replace

from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.flexpipe.groups import GroupView, Recut, group_refactors, pipeline_target
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.router import PACK_MAX_OVER_TARGET, Endpoint, route
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
        eps[chosen] = replace(e, outstanding=e.outstanding + 1)
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


def test_pack_fills_coarse_groups_first_and_overflows_by_throughput() -> None:
    """§6.1 Eq. 5's multi-granular pool: a one-stage group is filled to its target before
    a four-stage one (fewer hops); past every target, a four-stage group (four
    micro-batches in flight) takes four times the requests of a one-stage one, and none
    takes more than `PACK_MAX_OVER_TARGET` x its target: the rest wait at the router."""
    groups = [Endpoint(0, 0, 256, 1.0, 32.0, num_stages=4), Endpoint(1, 0, 64, 1.0, 8.0)]
    assert _fill(groups, "pack", 8) == [1] * 8
    full = [replace(groups[0], outstanding=32), replace(groups[1], outstanding=8)]
    over = _fill(full, "pack", 20)
    assert over.count(0) == 16 and over.count(1) == 4  # 4:1, as their throughputs
    cap = [Endpoint(0, int(PACK_MAX_OVER_TARGET * 8), 64, 1.0, 8.0)]
    assert route(cap, "pack") is None
    assert route(cap, "least-loaded") == 0  # the other rule fills to the batch limit


def test_busy_groups_split_while_requests_wait_and_merge_to_what_holds_their_load() -> None:
    base = AutoscaleSettings(target_ongoing_requests=8.0)
    settings = FlexPipeSettings()
    groups = [
        GroupView(1, 1, 12),  # busy, coarser than wanted
        GroupView(2, 4, 30),  # busy, at the finest wanted
        GroupView(3, 1, 2, refactoring=True),  # being refactored
        GroupView(4, 2, 0),  # idle while others serve: draining
    ]
    # requests wait: the busy coarse group splits to Eq. 4's (capped) choice
    assert group_refactors(groups, 4, 3, base, settings) == (Recut(1, 4),)
    # none waits: no split; each busy group merges to the coarsest shape whose target
    # holds it (12 requests: two stages, 16; 30: four, 32; 5: one, 8), never finer than it
    # is; the idle one is left to drain
    assert group_refactors(groups, 4, 0, base, settings) == ()
    calm = [GroupView(1, 4, 12), GroupView(2, 4, 30), GroupView(4, 8, 5)]
    assert group_refactors(calm, 4, 0, base, settings) == (Recut(1, 2), Recut(4, 1))
    # a static shape (one stage count) is never re-cut
    static = FlexPipeSettings(stage_counts=(4,), cv_targets=(0.0,))
    assert group_refactors(calm[:2], 4, 3, base, static) == ()
    assert group_refactors(calm[:2], 4, 0, base, static) == ()


def test_when_all_groups_idle_the_next_to_serve_merges_to_the_coarsest() -> None:
    base, settings = AutoscaleSettings(target_ongoing_requests=8.0), FlexPipeSettings()
    groups = [GroupView(7, 8, 0), GroupView(3, 8, 0), GroupView(5, 1, 0)]
    assert group_refactors(groups, 8, 0, base, settings) == (Recut(3, 1),)
    assert group_refactors([GroupView(5, 1, 0)], 8, 0, base, settings) == ()


def test_without_busy_merges_only_the_idle_group_served_next_merges() -> None:
    """`merge_busy_groups` False (a counterfactual, docs/flexpipe.md): a busy group keeps
    its stages when none waits; splits under a queue and the idle next-up merge remain."""
    base = AutoscaleSettings(target_ongoing_requests=8.0)
    off = FlexPipeSettings(merge_busy_groups=False)
    calm = [GroupView(1, 4, 12), GroupView(2, 4, 30), GroupView(4, 8, 5)]
    assert group_refactors(calm, 4, 0, base, FlexPipeSettings()) == (Recut(1, 2), Recut(4, 1))
    assert group_refactors(calm, 4, 0, base, off) == ()
    assert group_refactors([GroupView(1, 1, 12)], 4, 3, base, off) == (Recut(1, 4),)
    assert group_refactors([GroupView(7, 8, 0), GroupView(3, 8, 0)], 8, 0, base, off) == (
        Recut(3, 1),
    )
