"""The real engine's step profile behind BlitzScale §5.3's monitor bounds: taken of a tiny
model made here (`engine/step_profile.py`), kept on disk once per model, device and engine
settings (`runtime/step_profiles.py`), and read by `surge serve`'s monitor
(`control/emulation.instance_costs`, `deployment_profile`) in place of the host's rule-of-thumb
estimates. A damaged file is measured again with a warning; a directory that cannot be written
is one error line; a compile running while steps are timed throws the timing away."""

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from surge.cli.serve_config import step_profile_dir
from surge.config import EngineConfig
from surge.control.emulation import deployment_profile, instance_costs
from surge.control.settings import ControllerConfig
from surge.control.spec import DeploymentSpec
from surge.engine import step_profile
from surge.errors import SurgeError
from surge.model.manifest import read_manifest
from surge.policy.blitzscale.monitor import StepProfile, bounds, profile_costs
from surge.policy.slo import Slo
from surge.runtime.launch.agent_process import local_agent_threads
from surge.runtime.scaleout.estimates import HOST_ESTIMATES
from surge.runtime.step_profiles import ensure_profile, profile_key, profile_path
from tests.conftest import run_surge

ENGINE = EngineConfig(compile_decode=False, max_num_seqs=16)
FAKE = StepProfile(((32, 0.01), (128, 0.03)), ((1, 0.02), (16, 0.05)))


@contextmanager
def agent_threads(nodes: int) -> Iterator[None]:
    """torch computing on the threads of one of `nodes` local agents (as their profile is
    taken and keyed), then as it was."""
    before = torch.get_num_threads()
    torch.set_num_threads(local_agent_threads(nodes))
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def no_measuring(monkeypatch: pytest.MonkeyPatch) -> list:
    """`measure_steps` replaced by one returning `FAKE` (the calls are counted)."""
    calls: list = []

    def fake(manifest, config, progress=None):
        calls.append(config)
        return FAKE

    monkeypatch.setattr(step_profile, "measure_steps", fake)
    return calls


def test_the_tiny_engines_profile_sets_the_monitor_bounds(tiny_store: Path, tmp_path: Path):
    manifest = read_manifest(tiny_store)
    lines: list[str] = []
    p = ensure_profile(manifest, ENGINE, tmp_path, lines.append)
    assert [n for n, _ in p.prefill_s] == [32, 128, 512]
    assert [b for b, _ in p.decode_s] == [1, 8, 16]  # up to max_num_seqs
    assert lines[0].startswith("profiling") and lines[-1].startswith("profiled")
    costs = instance_costs(None, HOST_ESTIMATES, manifest.total_bytes, ENGINE, p)
    for b, s in p.decode_s:  # the monitor's decode steps are the measured ones
        assert costs.decode_s(b) == s
    n, s = p.prefill_s[-1]
    assert costs.prefill_s(ENGINE.max_prefill_tokens) == pytest.approx(
        ENGINE.max_prefill_tokens * s / n
    )
    got = bounds(costs, Slo())
    assert got == bounds(profile_costs(p, ENGINE.max_prefill_tokens, 16), Slo())
    estimate = bounds(instance_costs(None, HOST_ESTIMATES, manifest.total_bytes, ENGINE), Slo())
    assert got.prefill_tokens_per_s != pytest.approx(estimate.prefill_tokens_per_s)
    # kept: the next deploy reads it (an unchanged profile, nothing measured)
    again = ensure_profile(manifest, ENGINE, tmp_path, lines.append)
    assert again == p and lines[-1].startswith("profiled") and len(list(tmp_path.iterdir())) == 1


def test_the_key_is_the_model_the_device_and_the_settings(tiny_store: Path, tmp_path: Path):
    manifest = read_manifest(tiny_store)
    key = profile_key(manifest, ENGINE, "cpu:x")
    path = profile_path(tmp_path, manifest, key)
    assert path != profile_path(tmp_path, manifest, profile_key(manifest, ENGINE, "cuda:y"))
    other = EngineConfig(compile_decode=True, max_num_seqs=16)
    assert path != profile_path(tmp_path, manifest, profile_key(manifest, other, "cpu:x"))
    assert key["model_digest"] == profile_key(manifest, other, "cpu:x")["model_digest"]


def test_a_damaged_profile_is_measured_again(
    tiny_store: Path, tmp_path: Path, no_measuring: list, caplog: pytest.LogCaptureFixture
):
    manifest = read_manifest(tiny_store)
    ensure_profile(manifest, ENGINE, tmp_path)
    (path,) = tmp_path.iterdir()
    for damage in ("{not json", json.dumps({"key": "x"}), ""):
        path.write_text(damage)
        with caplog.at_level(logging.WARNING):
            assert ensure_profile(manifest, ENGINE, tmp_path) == FAKE
        assert "measuring again" in caplog.text
        caplog.clear()
    assert len(no_measuring) == 4
    good = json.loads(path.read_text())  # rewritten whole
    good["decode_s"] = [[1, -1.0]]
    path.write_text(json.dumps(good))
    with caplog.at_level(logging.WARNING):
        assert ensure_profile(manifest, ENGINE, tmp_path) == FAKE
    assert "damaged" in caplog.text


def test_an_unwritable_directory_is_one_error_or_a_warning(
    tiny_store: Path, tmp_path: Path, no_measuring: list, caplog: pytest.LogCaptureFixture
):
    manifest = read_manifest(tiny_store)
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the directory should be (root can write anywhere)
    with pytest.raises(SurgeError, match="cannot write the step profile"):
        ensure_profile(manifest, ENGINE, blocked / "profiles", must_save=True)
    assert no_measuring == []  # said before the seconds of measuring
    with caplog.at_level(logging.WARNING):
        assert ensure_profile(manifest, ENGINE, blocked / "profiles") == FAKE
    assert "serves this process only" in caplog.text


def test_a_compile_during_the_timing_times_again(monkeypatch: pytest.MonkeyPatch):
    class Graph:  # one compile ran during the first timing, none during the second
        num_compiles, compiling = 0, False

        def wait(self, timeout_s=None):
            return True

    class Runner:
        decode_graph = Graph()

    graph = Runner.decode_graph
    monkeypatch.setattr(step_profile, "wait_for_compiles", lambda timeout_s=-1: True)
    timings = iter([[9.0, 9.0], [1.0, 2.0]])

    def timed() -> list[float]:
        got = next(timings)
        if got[0] == 9.0:
            graph.num_compiles += 1
        return got

    assert step_profile._steady(Runner(), timed) == 1.0  # the slow timing is thrown away


def test_serve_profiles_a_deployment_whose_monitor_asks(
    tiny_store: Path, tmp_path: Path, no_measuring: list, caplog: pytest.LogCaptureFixture
):
    manifest = read_manifest(tiny_store)
    on = ControllerConfig(state_dir=tmp_path, step_profile_dir=tmp_path / "profiles")
    blitz = DeploymentSpec.from_json({"name": "m", "model": "/m", "strategy": "blitzscale"})
    other = DeploymentSpec.from_json({"name": "m", "model": "/m", "strategy": "lambdascale"})
    # kept: FAKE, as if measured on the CPU threads of one of serve's local agents
    with agent_threads(on.nodes):
        ensure_profile(manifest, ENGINE, tmp_path / "profiles")
    # the child process (`profile_in_child`) reads it, computing on those threads (on
    # torch's default, all the cores, its key would differ): serve's monitor takes it
    assert asyncio.run(deployment_profile(on, ENGINE, blitz, manifest)) == FAKE
    assert asyncio.run(deployment_profile(on, ENGINE, other, manifest)) is None  # no bounds
    off = ControllerConfig(state_dir=tmp_path)
    assert asyncio.run(deployment_profile(off, ENGINE, blitz, manifest)) is None
    gone = replace(manifest, root=tmp_path / "gone")  # the child fails: one warning
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(deployment_profile(on, ENGINE, blitz, gone)) is None
    assert "bounds are estimated" in caplog.text and "Traceback" not in caplog.text


def test_cli_profile_bad_directory_and_damaged_file(tiny_store: Path, tmp_path: Path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    r = run_surge("model", "profile", str(tiny_store), "--profile-dir", str(blocked))
    assert r.returncode == 2 and r.stderr.startswith("error: cannot write the step profile")
    assert "Traceback" not in r.stderr
    config = EngineConfig(compile_decode=False, max_num_seqs=1)
    manifest = read_manifest(tiny_store)
    with agent_threads(ControllerConfig.nodes):  # the command's default: serve's nodes
        key = profile_key(manifest, config, step_profile.device_label(config))
    path = profile_path(tmp_path / "p", manifest, key)
    path.parent.mkdir()
    path.write_text("garbage")  # where the command looks for this store and these settings
    args = ("model", "profile", str(tiny_store), "--no-compile-decode", "--max-num-seqs", "1")
    r = run_surge(*args, "--profile-dir", str(tmp_path / "p"))
    assert r.returncode == 0, r.stderr
    assert "damaged" in r.stderr and "profiling" in r.stderr and "Traceback" not in r.stderr
    assert "monitor bounds" in r.stdout
    assert json.loads(path.read_text())["key"] == json.loads(json.dumps(key))


def test_serve_profiles_only_its_own_unemulated_agents(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SURGE_HOME", "/srv/surge")
    assert step_profile_dir({}) == Path("/srv/surge/profiles")
    assert step_profile_dir({"profile_dir": "/p"}) == Path("/p")
    for off in (
        {"profile_engine": False},
        {"launcher": "static"},  # the agents' device is not this machine's
        {"launcher": "ray"},
        {"cluster": "netns"},  # each agent under a CPU quota
        {"emulation": object()},  # its own cost model
    ):
        assert step_profile_dir(off) is None
