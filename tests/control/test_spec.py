"""A deployment's strategy names a `surge.policy.systems` entry that `surge serve` runs."""

import pytest

from surge.cli.serve_config import SERVE_STRATEGIES
from surge.control.spec import DeploymentSpec
from surge.errors import SurgeError
from surge.policy.systems import SYSTEMS, serve_system


def test_served_strategies_are_the_systems_surge_serve_runs() -> None:
    assert set(SERVE_STRATEGIES) >= {"lambdascale", "blitzscale", "paraserve", "serverlessllm"}
    for name in SERVE_STRATEGIES:
        spec = DeploymentSpec.from_json({"name": "m", "model": "/m", "strategy": name})
        assert spec.strategy == name and serve_system(spec.strategy) is SYSTEMS[name]


def test_the_old_name_is_an_alias_and_simulator_only_systems_are_refused() -> None:
    spec = DeploymentSpec.from_json({"name": "m", "model": "/m", "strategy": "load-then-serve"})
    assert spec.strategy == "serverlessllm"
    for name in (n for n, s in SYSTEMS.items() if not s.serve):
        with pytest.raises(SurgeError, match="only in the simulator"):
            DeploymentSpec.from_json({"name": "m", "model": "/m", "strategy": name})
    with pytest.raises(SurgeError, match="unknown strategy 'magic'; choose one of"):
        DeploymentSpec.from_json({"name": "m", "model": "/m", "strategy": "magic"})


def test_autoscaling_takes_the_ray_serve_knob_names_only() -> None:
    spec = DeploymentSpec.from_json(
        {
            "name": "m",
            "model": "/m",
            "autoscaling": {"target_ongoing_requests": 2, "keep_alive_s": None},
        }
    )
    assert spec.autoscaling.target_ongoing_requests == 2 and spec.autoscaling.keep_alive_s is None
    with pytest.raises(SurgeError, match="unknown field 'scale_down_delay_s'"):
        DeploymentSpec.from_json(
            {"name": "m", "model": "/m", "autoscaling": {"scale_down_delay_s": 1}}
        )
