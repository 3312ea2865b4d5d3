"""The compile gate's settings (`EngineConfig.compile_quiet_s`, `compile_defer_max_s`) are
exposed where the other engine settings are: `surge serve`'s config keys (to every agent's
command line) and `surge node run`'s flags. A bad value is one `error:` line, exit 2, before
anything starts."""

import os
from pathlib import Path

import pytest

from surge.cli.serve_config import controller_config, load_config
from surge.config import EngineConfig
from surge.control.launching import launch_cluster
from surge.control.settings import ControllerConfig
from surge.errors import SurgeError
from surge.runtime.launch.agent_process import agent_argv
from surge.runtime.launch.local import LocalCluster
from tests.cli.test_cli import assert_one_line_error
from tests.cli.test_serve_settings import surge_serve
from tests.conftest import run_surge


def test_the_config_keys_reach_every_agent(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("compile_quiet_s: 0.5\ncompile_defer_max_s: .inf\n")
    ccfg = controller_config({**load_config(cfg_file), "cluster_settings": {}}, 2)
    cluster = launch_cluster(ccfg, tmp_path / "registry")
    assert isinstance(cluster, LocalCluster)
    for node in range(2):
        agent = cluster.agent_config(node)
        assert agent.engine.compile_quiet_s == 0.5
        assert agent.engine.compile_defer_max_s == float("inf")
        argv = agent_argv(agent)
        assert argv[argv.index("--compile-quiet-s") + 1] == "0.5"
        assert argv[argv.index("--compile-defer-max-s") + 1] == "inf"
    default = ControllerConfig(state_dir=tmp_path)  # the defaults live in EngineConfig alone
    assert default.compile_quiet_s == EngineConfig().compile_quiet_s == 2.0
    assert default.compile_defer_max_s == EngineConfig().compile_defer_max_s


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_a_negative_or_nan_setting_is_refused_once(tmp_path: Path, bad: float) -> None:
    for name in ("compile_quiet_s", "compile_defer_max_s"):
        with pytest.raises(SurgeError, match=f"{name} must be >= 0 seconds"):
            ControllerConfig(state_dir=tmp_path, **{name: bad})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("compile_quiet_s = -1\n", "compile_quiet_s must be >= 0 seconds"),
        ('compile_defer_max_s = "soon"\n', "compile_defer_max_s must be a float"),
    ],
)
def test_a_bad_config_value_is_one_line(tmp_path: Path, text: str, words: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    assert_one_line_error(surge_serve(tmp_path, "--config", str(cfg)), words)
    assert not (tmp_path / "state").exists(), "the server started"


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--compile-quiet-s", "-0.5", "compile_quiet_s must be >= 0 seconds"),
        ("--compile-defer-max-s", "nan", "compile_defer_max_s must be >= 0 seconds"),
    ],
)
def test_a_bad_node_flag_is_one_line(tmp_path: Path, flag: str, value: str, words: str) -> None:
    args = ("node", "run", "--node-id", "0", "--disk-dir", str(tmp_path / "disk"), flag, value)
    proc = run_surge(*args, env={**os.environ, "SURGE_TOKEN": "t" * 32}, timeout=60)
    assert_one_line_error(proc, words)
