"""A deployment's strategy names a `surge.policy.systems` entry that `surge serve` runs."""

import json
import re

import pytest

from surge.cli.serve_config import SERVE_STRATEGIES
from surge.control.spec import DeploymentSpec, new_deployment
from surge.control.store import DeploymentStore
from surge.errors import InvalidInput, SurgeError
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


FLEX = {"name": "m", "model": "/m", "strategy": "flexpipe"}


def test_a_flexpipe_deployment_keeps_its_systems_reclamation_unless_it_sets_its_own() -> None:
    """§9.1's always-ready 30% and §9.4's 5-minute reclamation reach `surge serve`."""
    plain = DeploymentSpec.from_json(FLEX)
    assert plain.autoscaling.always_ready_fraction == 0.3
    assert plain.autoscaling.downscale_delay_s == 300.0
    own = DeploymentSpec.from_json(FLEX | {"autoscaling": {"always_ready_fraction": 0}})
    assert own.autoscaling.always_ready_fraction == 0.0
    with pytest.raises(SurgeError, match="always_ready_fraction"):
        DeploymentSpec.from_json(FLEX | {"autoscaling": {"always_ready_fraction": 2}})
    # the peak lapses after 15 idle minutes unless the deployment says otherwise
    assert plain.autoscaling.forget_peak_after_idle_s == 900.0
    for value in (None, 60):
        own = DeploymentSpec.from_json(FLEX | {"autoscaling": {"forget_peak_after_idle_s": value}})
        assert own.autoscaling.forget_peak_after_idle_s == value
        assert DeploymentSpec.from_json(own.to_json()) == own  # as the store keeps it
    for bad in (0, -5, "soon"):
        with pytest.raises(SurgeError, match="forget_peak_after_idle_s"):
            DeploymentSpec.from_json(FLEX | {"autoscaling": {"forget_peak_after_idle_s": bad}})


def test_a_flexpipe_deployment_sets_its_own_knobs_over_the_systems() -> None:
    base = serve_system("flexpipe").flexpipe
    spec = DeploymentSpec.from_json(FLEX | {"flexpipe": {"decision_interval_s": 0.05}})
    assert spec.flexpipe is not None and spec.flexpipe.decision_interval_s == 0.05
    # the rest stays the system's, and the deployment's system carries the knobs
    assert spec.flexpipe.cv_window_s == base.cv_window_s
    assert spec.flexpipe.stage_counts == base.stage_counts
    assert spec.system.flexpipe.decision_interval_s == 0.05
    assert spec.system.group_sizing == "flexpipe"
    shape = {"stage_counts": [1, 2], "cv_targets": [1, 4], "cv_window_s": 5}
    spec2 = DeploymentSpec.from_json(FLEX | {"flexpipe": shape})
    assert spec2.system.flexpipe.stage_counts == (1, 2)
    assert spec2.system.flexpipe.cv_targets == (1.0, 4.0)
    # none given: the system's own settings object
    plain = DeploymentSpec.from_json(FLEX)
    assert plain.flexpipe is None and plain.system is serve_system("flexpipe")


def test_flexpipe_knobs_survive_the_json_round_trip_and_the_store(tmp_path) -> None:
    knobs = {"decision_interval_s": 0.05, "stage_counts": [1, 4], "cv_targets": [1, 8]}
    spec = DeploymentSpec.from_json(FLEX | {"flexpipe": knobs})
    assert DeploymentSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    store = DeploymentStore(tmp_path / "deployments.sqlite")
    store.add(spec)
    store.add(DeploymentSpec.from_json(FLEX | {"name": "plain"}))
    store.close()
    again = DeploymentStore(tmp_path / "deployments.sqlite")  # a controller restart
    [back, plain] = again.all()
    again.close()
    assert back == spec and back.system.flexpipe.decision_interval_s == 0.05
    assert plain.flexpipe is None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"decision_interval_s": 0}, "decision_interval_s must be > 0"),
        ({"decision_interval_s": "fast"}, "decision_interval_s must be a number"),
        ({"cv_window_s": -1}, "cv_window_s must be > 0"),
        ({"interval": 1}, "unknown field 'interval' in flexpipe"),
        ({"stage_counts": [1, 2]}, "one CV target per stage count"),
        ({"stage_counts": [2, 1], "cv_targets": [1, 2]}, "ascending"),
        ({"stage_counts": "1,2"}, "stage_counts must be a non-empty list"),
        ({"min_group_kv_tokens": 0}, "min_group_kv_tokens must be >= 1"),
        (3, "flexpipe must be an object"),
    ],
)
def test_bad_flexpipe_knobs_are_refused_naming_the_field(body, words) -> None:
    with pytest.raises(SurgeError, match=re.escape(words)):
        DeploymentSpec.from_json(FLEX | {"flexpipe": body})


def test_flexpipe_knobs_need_the_flexpipe_strategy() -> None:
    with pytest.raises(SurgeError, match="strategy 'flexpipe' only"):
        DeploymentSpec.from_json(
            {"name": "m", "model": "/m", "strategy": "lambdascale", "flexpipe": {}}
        )


@pytest.mark.parametrize("name", ["m\n", "m\r\n", "", ".m", "x" * 65, "a b"])
def test_a_deployment_name_is_checked_whole(name: str) -> None:
    """A trailing newline got through (`re.match` with `$`): a model named "m\\n" served."""
    with pytest.raises(SurgeError, match="name must be 1-64 characters"):
        DeploymentSpec.from_json({"name": name, "model": "/m"})
    assert DeploymentSpec.from_json({"name": "m-1.b_2", "model": "/m"}).name == "m-1.b_2"


def test_a_new_deployments_chat_template_must_compile_a_stored_one_still_comes_back(
    tmp_path,
) -> None:
    """A config file's or POST /v1/deployments' template was compiled only on the first chat
    request (then every chat answered 400); a stored one must still be read back."""
    broken = {"name": "m", "model": "/m", "chat_template": "{% for m in messages %}{{ m }"}
    with pytest.raises(InvalidInput, match="chat_template does not compile: ") as e:
        new_deployment(broken)
    assert e.value.param == "chat_template"
    good = new_deployment(broken | {"chat_template": "{{ messages[0].content }}"})
    assert good.chat_template == "{{ messages[0].content }}"
    store = DeploymentStore(tmp_path / "deployments.sqlite")
    store.add(DeploymentSpec.from_json(broken))  # stored before the check existed
    [back] = store.all()
    store.close()
    assert back.chat_template == broken["chat_template"]
