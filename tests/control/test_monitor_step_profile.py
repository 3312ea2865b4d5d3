"""`surge serve`'s autoscaler sizes a BlitzScale deployment by its engine's step profile once
the deployment has one (BlitzScale §5.3, `Deployment.step_profile`, set in the background by
`control/deployments.py`), and by the host's estimates until then."""

from pathlib import Path

import pytest

from surge.config import EngineConfig
from surge.control.settings import ControllerConfig
from surge.control.spec import DeploymentSpec
from surge.control.state import Deployment
from surge.model.manifest import read_manifest
from surge.policy.blitzscale.monitor import StepProfile, bounds, profile_costs
from tests.control.scripted import bare_autoscaler

PROFILE = StepProfile(((32, 0.02), (512, 0.2)), ((1, 0.01), (16, 0.05), (64, 0.4)))


def test_the_bounds_switch_to_the_profile_when_it_comes(tiny_store: Path, tmp_path: Path):
    auto = bare_autoscaler(ControllerConfig(state_dir=tmp_path))
    spec = DeploymentSpec.from_json({"name": "m", "model": "/m", "strategy": "blitzscale"})
    dep = Deployment(spec, read_manifest(tiny_store), None, None)  # type: ignore[arg-type]
    estimated = auto.settings(dep)
    dep.step_profile = PROFILE
    got = auto.settings(dep)
    engine = EngineConfig()
    b = bounds(profile_costs(PROFILE, engine.max_prefill_tokens, engine.max_num_seqs),
               spec.slo.seconds())  # fmt: skip
    assert got.target_tokens_per_s == pytest.approx(b.decode_tokens_per_s)
    assert got.target_prefill_tokens_per_s == pytest.approx(b.prefill_tokens_per_s)
    assert got.target_tokens_per_s != pytest.approx(estimated.target_tokens_per_s)
