"""What a local cluster leaves: its temporary work directory exists from `start` to `stop`
and nowhere else — building a cluster or asking for an agent's settings makes nothing (tests
did, and left an empty `surge-cluster-*` in /tmp per call); what a launcher killed outright
(SIGKILL) left is removed by the next cluster to start; and its agents exit by themselves,
even one whose launcher died before the agent was ready (it outlived it for good)."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from surge.control.launching import launch_cluster
from surge.control.settings import ControllerConfig
from surge.runtime.launch.local import (
    WORK_DIR_PREFIX,
    LocalCluster,
    LocalClusterConfig,
    sweep_stale_work_dirs,
)
from tests.conftest import REPO
from tests.runtime.conftest import gone


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system temporary directory, for this test: an empty one of its own."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob(WORK_DIR_PREFIX + "*"))


def test_settings_of_a_cluster_that_never_starts_make_no_files(tmp_root: Path) -> None:
    cluster = LocalCluster(LocalClusterConfig(num_nodes=2))
    disk = cluster.agent_config(1).disk_dir
    assert disk.parent == cluster.work_dir and disk.parent.parent == tmp_root
    cfg = ControllerConfig(state_dir=tmp_root.parent / "state", nodes=3)
    launch_cluster(cfg, tmp_root.parent / "registry").agent_config(2)  # type: ignore[attr-defined]
    assert leftovers(tmp_root) == []


def test_the_work_dir_lives_from_start_to_stop(tmp_root: Path) -> None:
    with LocalCluster(LocalClusterConfig(num_nodes=2, preload_engine=False)) as cluster:
        assert cluster.work_dir.is_dir()
        assert leftovers(tmp_root) == [cluster.work_dir.name]
    assert leftovers(tmp_root) == []
    cluster.agent_config(0)  # after stop too
    assert leftovers(tmp_root) == []


def test_a_start_that_fails_removes_its_work_dir(tmp_root: Path) -> None:
    bad = LocalClusterConfig(num_nodes=1, preload_engine=False, extra_args={0: ["--no-such"]})
    with pytest.raises(Exception, match="exited"), LocalCluster(bad):
        pass
    assert leftovers(tmp_root) == []


LAUNCHER = """
import json, time
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
with LocalCluster(LocalClusterConfig(num_nodes=2, preload_engine=False)) as c:
    pids = [p.pid for p in c.procs.values()]
    print(json.dumps({"work_dir": str(c.work_dir), "pids": pids}), flush=True)
    time.sleep(120)
"""


def test_what_a_killed_launcher_left_is_swept_by_the_next_start(tmp_root: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
    )
    try:
        started = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGKILL)  # no cleanup runs in the launcher
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]
    stale = Path(started["work_dir"])
    assert stale.parent == tmp_root and (stale / "node1").is_dir(), "nothing left to sweep"
    deadline = time.monotonic() + 20  # the orphaned agents exit on their own
    while not all(gone(pid) for pid in started["pids"]):
        assert time.monotonic() < deadline, "an agent outlived its killed launcher"
        time.sleep(0.1)
    with LocalCluster(LocalClusterConfig(num_nodes=1, preload_engine=False)) as live:
        assert leftovers(tmp_root) == [live.work_dir.name], "the next start did not sweep"
        assert sweep_stale_work_dirs() == [], "a running launcher's directory was swept"
    assert leftovers(tmp_root) == []


EARLY_DEATH = """
import json, subprocess, time
from surge.runtime.launch.agent_process import agent_argv, agent_env
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
c = LocalCluster(LocalClusterConfig(num_nodes=1, preload_engine=False))
c.make_work_dir()
argv, env = agent_argv(c.agent_config(0)), agent_env(c.token)
agent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env=env)
print(json.dumps({"pid": agent.pid, "work_dir": str(c.work_dir)}), flush=True)
time.sleep(120)
"""


def test_an_agent_whose_launcher_died_before_it_was_ready_exits(tmp_root: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", EARLY_DEATH], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
    )
    try:
        started = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGKILL)  # the agent is still importing: not serving yet
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]
    pid = started["pid"]
    deadline = time.monotonic() + 30  # its start (~1-2 s) and one parent check (1 s)
    try:
        while not gone(pid):
            assert time.monotonic() < deadline, "the orphaned agent kept running"
            time.sleep(0.1)
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)  # the test made it
        sweep_stale_work_dirs()
    assert leftovers(tmp_root) == []


def test_an_agent_not_ready_in_time_is_an_error_saying_what_to_do() -> None:
    """Its message pointed at "its log", which does not exist: an agent's stderr is the
    launcher's own (walked: a busy machine's `surge serve`, load 12 on 2 CPUs)."""
    from surge.errors import SurgeError
    from surge.runtime.launch.agent_process import wait_ready

    proc = subprocess.Popen(["sleep", "30"], stdout=subprocess.PIPE)
    try:
        with pytest.raises(SurgeError) as e:
            wait_ready(3, proc, time.monotonic() + 0.3)
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
    msg = str(e.value)
    assert "node agent 3 did not start in time" in msg and "its log" not in msg, msg
    assert "printed is above" in msg and "fewer agents (--nodes)" in msg, msg
