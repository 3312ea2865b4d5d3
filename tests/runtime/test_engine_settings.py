"""Engine settings reach the agents `surge serve` starts: `fuse_projections` and
`compile_decode` in the controller's config go to every agent's command line and into its
`EngineConfig` (a bursty deployment turns fusing off; see docs/engine.md)."""

from pathlib import Path

from surge.control.launching import launch_cluster
from surge.control.settings import ControllerConfig
from surge.runtime.launch.agent_process import agent_argv
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig


def test_the_controllers_engine_settings_reach_every_agents_command_line(tmp_path: Path) -> None:
    cfg = ControllerConfig(state_dir=tmp_path, nodes=2, fuse_projections=False, compile_decode=True)
    cluster = launch_cluster(cfg, tmp_path / "registry")
    assert isinstance(cluster, LocalCluster)
    for node in range(2):
        agent = cluster.agent_config(node)
        assert not agent.engine.fuse_projections and agent.engine.compile_decode
        argv = agent_argv(agent)
        assert "--no-fuse-projections" in argv and "--compile-decode" in argv
    default = LocalCluster(LocalClusterConfig(num_nodes=1)).agent_config(0)
    argv = agent_argv(default)  # the defaults add nothing
    assert default.engine.fuse_projections and not default.engine.compile_decode
    assert "--no-fuse-projections" not in argv and "--compile-decode" not in argv


def test_agents_start_with_the_settings_on_their_command_line(tmp_path: Path) -> None:
    # An option the node command did not know would stop the agent before it is ready.
    cfg = LocalClusterConfig(
        num_nodes=1, fuse_projections=False, compile_decode=True, preload_engine=False
    )
    with LocalCluster(cfg) as cluster:
        assert len(cluster.addresses) == 1
