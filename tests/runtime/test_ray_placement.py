"""The Ray launcher's placement group and host groups, built without a Ray cluster."""

import pytest

from surge.errors import SurgeError
from surge.runtime.launch.ray_placement import MIN_BUNDLE_CPUS, host_groups, plan_placement


def test_agents_get_one_gpu_each_and_pack_where_the_cluster_has_gpus() -> None:
    plan = plan_placement(4, 2.0, None, "auto", cluster_gpus=8)
    assert plan.bundles == ({"CPU": 2.0, "GPU": 1.0},) * 4
    assert plan.strategy == "PACK" and plan.gpus_per_agent == 1.0


def test_cpu_only_agents_spread_and_still_ask_for_something() -> None:
    plan = plan_placement(3, 0.0, None, "auto", cluster_gpus=0)
    assert plan.bundles == ({"CPU": MIN_BUNDLE_CPUS},) * 3  # Ray refuses empty bundles
    assert plan.strategy == "SPREAD" and plan.gpus_per_agent == 0.0


@pytest.mark.parametrize(("setting", "strategy"), [("pack", "PACK"), ("spread", "STRICT_SPREAD")])
def test_the_setting_chooses_the_strategy(setting: str, strategy: str) -> None:
    assert plan_placement(2, 1.0, 0.5, setting, cluster_gpus=4).strategy == strategy


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((4, 0.0, None, "auto", 2), "need 4 GPUs; the Ray cluster has 2"),
        ((2, 0.0, 1.0, "auto", 0), "need 2 GPUs; the Ray cluster has 0"),
        ((2, 0.0, None, "scatter", 0), "not one of auto, pack, spread"),
        ((2, -1.0, None, "auto", 0), "CPUs per agent must be >= 0"),
    ],
)
def test_impossible_placements_are_one_clear_error(args, message) -> None:
    with pytest.raises(SurgeError, match=message):
        plan_placement(*args)


def test_agents_on_one_ray_node_form_a_host_group() -> None:
    groups = host_groups({0: "nodeA" * 4, 1: "nodeB" * 4, 2: "nodeA" * 4, 3: "nodeC" * 4})
    name = f"ray-{('nodeA' * 4)[:12]}"
    assert groups == {0: (name, (2,)), 2: (name, (0,)), 1: (None, ()), 3: (None, ())}


@pytest.mark.parametrize(
    ("launcher", "cfg", "message"),
    [
        ("local", {"ray_placement": "pack"}, "need --launcher ray"),
        ("ray", {"ray_placement": "scatter"}, "ray_placement must be one of auto, pack, spread"),
        ("ray", {"ray_gpus_per_agent": -1}, "ray_gpus_per_agent must be >= 0"),
    ],
)
def test_serve_checks_the_ray_settings_before_anything_starts(launcher, cfg, message) -> None:
    from surge.cli.serve_cluster import cluster_settings

    with pytest.raises(SurgeError, match=message):
        cluster_settings(launcher, {}, cfg)
    assert cluster_settings("ray", {}, {"ray_placement": "spread", "ray_gpus_per_agent": 2}) == {
        "ray_placement": "spread",
        "ray_gpus_per_agent": 2.0,
    }
