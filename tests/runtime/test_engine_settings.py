"""Engine settings reach the agents `surge serve` starts: `fuse_projections` and
`compile_decode` in the controller's config go to every agent's command line and into its
`EngineConfig` (a bursty deployment turns fusing off; see docs/engine.md). A cluster's stall
timeout reaches its agents' command lines and its client's sockets; out of range, refused."""

import asyncio
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from surge.config import COMPILE_DECODE_ENV, EngineConfig
from surge.control.launching import launch_cluster
from surge.control.settings import ControllerConfig
from surge.errors import SurgeError
from surge.runtime.client import ClusterClient
from surge.runtime.launch.agent_process import agent_argv
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.node.context import AgentConfig
from tests.cli.test_cli import assert_one_line_error
from tests.conftest import run_surge


def test_the_controllers_engine_settings_reach_every_agents_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ControllerConfig(state_dir=tmp_path, nodes=2, fuse_projections=False, compile_decode=True)
    cluster = launch_cluster(cfg, tmp_path / "registry")
    assert isinstance(cluster, LocalCluster)
    for node in range(2):
        agent = cluster.agent_config(node)
        assert not agent.engine.fuse_projections and agent.engine.compile_decode
        argv = agent_argv(agent)
        assert "--no-fuse-projections" in argv and "--compile-decode" in argv
    monkeypatch.delenv(COMPILE_DECODE_ENV, raising=False)  # the suite turns it off
    default = LocalCluster(LocalClusterConfig(num_nodes=1)).agent_config(0)
    argv = agent_argv(default)  # compiled by default, said explicitly to the agent
    assert default.engine.fuse_projections and default.engine.compile_decode
    assert "--no-fuse-projections" not in argv and "--compile-decode" in argv
    assert ControllerConfig(state_dir=tmp_path).compile_decode


def test_the_controllers_stall_timeout_goes_to_every_launcher(tmp_path: Path) -> None:
    for launcher in ("local", "ray"):  # Ray's agents: `ray_cluster.agent_config` (test_ray)
        cfg = ControllerConfig(state_dir=tmp_path, nodes=2, launcher=launcher, stall_timeout_s=4.5)
        cluster = launch_cluster(cfg, tmp_path / "registry")
        assert cluster.config.stall_timeout_s == 4.5
    with pytest.raises(SurgeError, match=r"stall_timeout_s \(--stall-timeout-s\): .*3 to 3600"):
        ControllerConfig(state_dir=tmp_path, stall_timeout_s=2.0)


@pytest.mark.parametrize(("value", "want"), [("0", False), ("off", False), ("1", True), ("", True)])
def test_compile_decode_default_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, want: bool
) -> None:
    monkeypatch.setenv(COMPILE_DECODE_ENV, value)
    assert EngineConfig().compile_decode is want
    assert LocalClusterConfig(num_nodes=1).compile_decode is want
    argv = agent_argv(LocalCluster(LocalClusterConfig(num_nodes=1)).agent_config(0))
    assert ("--compile-decode" if want else "--no-compile-decode") in argv
    assert EngineConfig(compile_decode=not want).compile_decode is not want  # explicit wins


def test_agents_start_with_the_settings_on_their_command_line(tmp_path: Path) -> None:
    # An option the node command did not know would stop the agent before it is ready.
    cfg = LocalClusterConfig(
        num_nodes=1,
        fuse_projections=False,
        compile_decode=True,
        preload_engine=False,
        stall_timeout_s=3.5,
        compile_quiet_s=0.5,
        compile_defer_max_s=float("inf"),
    )
    with LocalCluster(cfg) as cluster:
        assert len(cluster.addresses) == 1
        argv = agent_argv(cluster.agent_config(0))
        assert argv[argv.index("--stall-timeout-s") + 1] == "3.5"

        async def user_timeouts_ms() -> list[int]:
            client = cluster.client()
            await client.connect()
            try:  # the kernel's bound on unacknowledged data: the stall timeout
                socks = [c.sock for c in client.conns.values()]
                return [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) for s in socks]
            finally:
                await client.close()

        assert asyncio.run(user_timeouts_ms()) == [3500]
    assert "--stall-timeout-s" not in agent_argv(
        replace(cluster.agent_config(0), stall_timeout_s=8)
    )


@pytest.mark.parametrize("bad", [2.9, 0.0, float("nan"), 1e9])
def test_a_stall_timeout_out_of_range_is_refused(tmp_path: Path, bad: float) -> None:
    with pytest.raises(SurgeError, match="stall timeout must be 3 to 3600 s"):
        AgentConfig(node=0, cluster_id="c", token="t", disk_dir=tmp_path, stall_timeout_s=bad)
    with pytest.raises(SurgeError, match="stall timeout"):
        ClusterClient({}, "t", stall_timeout_s=bad)


def test_node_run_refuses_a_short_stall_timeout_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "SURGE_TOKEN": "0123456789abcdef" * 2}
    proc = run_surge(
        "node", "run", "--node-id", "0", "--cluster-id", "c", "--disk-dir", str(tmp_path),
        "--stall-timeout-s", "1", env=env,
    )  # fmt: skip
    assert_one_line_error(proc, "--stall-timeout-s", "3 to 3600 s (got 1)")
