"""Resource admission and bounded stop (issue 36): a cluster the machine cannot hold is refused
before anything starts, with the numbers; SIGTERM or SIGINT while agents are still starting
stops every one of them within seconds."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from surge.policy.nodes.machine_fit import (
    AGENT_BASE_BYTES,
    ClusterAsk,
    MachineFacts,
    machine_problems,
)
from tests.cli.test_cli import assert_one_line_error
from tests.conftest import REPO, run_surge
from tests.control.conftest import process_alive

GB = 10**9


def test_machine_fit_names_each_problem_with_its_numbers() -> None:
    small = MachineFacts(cpus=2, available_memory_bytes=24 * GB, shm_total_bytes=12 * GB)
    assert machine_problems(ClusterAsk(4, 4 << 30), small) == []
    memory, cpus = machine_problems(ClusterAsk(1000, 4 << 30), small)
    fit = (24 * GB - (512 << 20)) // AGENT_BASE_BYTES
    assert "--nodes 1000 needs at least" in memory and f"use --nodes {fit} or fewer" in memory
    assert "24.0 GB available" in memory
    assert "2 CPUs here" in cpus and "use --nodes 32 or fewer" in cpus
    (shm,) = machine_problems(ClusterAsk(2, 16 << 30), small)
    assert "host_cache_gb 16 is larger than /dev/shm (12.0 GB)" in shm


def test_nodes_beyond_this_machine_are_refused_before_anything_starts(tmp_path: Path) -> None:
    env = {**os.environ, "SURGE_HOME": str(tmp_path / "home")}
    state = str(tmp_path / "state")
    t0 = time.monotonic()
    proc = run_surge("serve", "--nodes", "1000", "--port", "0", "--state-dir", state, env=env,
                     timeout=60)  # fmt: skip
    assert_one_line_error(proc, "--nodes 1000", "GB available", "--allow-overcommit")
    assert time.monotonic() - t0 < 30 and not (tmp_path / "state").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_agents_start_stops_them_all_within_seconds(tmp_path: Path, sig) -> None:
    env = {**os.environ, "SURGE_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "surge.cli", "serve", "--nodes", "8", "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
        text=True,
        start_new_session=True,
        # A terminal's foreground job gets SIGINT's default action (a runner may ignore it).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    agents: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(agents) < 8 and time.monotonic() < deadline:  # every agent spawned, none ready
            agents |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)
                       if "node" in c.cmdline()}  # fmt: skip
            time.sleep(0.05)
        assert len(agents) == 8, "the agents were not spawned"
        t0 = time.monotonic()
        if sig == signal.SIGINT:  # a terminal's Ctrl-C: the whole foreground group
            os.killpg(proc.pid, sig)
        else:  # `kill PID`
            os.kill(proc.pid, sig)
        proc.wait(60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        # An agent may exit between any two looks at it: `process_alive` asks once (a
        # pid_exists-then-Process pair raised NoSuchProcess in between, see test_healing).
        left = [p for p in agents if process_alive(p)]
        for p in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    assert not left, f"agents outlived surge serve: {left}"
    print(f"stopped in {took:.1f} s")
    assert took < 12, f"surge serve took {took:.1f} s to stop while its agents started"
    assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")
