"""Starting a node agent process, the same way from every launcher.

What flows: an `AgentConfig` in, the `surge node run` command line out (`agent_argv`, the
inverse of `cli/node.py`); the agent's token goes into its environment (`agent_env`), never
on a command line; `wait_ready` reads the agent's ready line `{"ready": true, "port": P}`.
Used by `LocalCluster` (`launch/local.py`), `NetnsCluster` (`launch/netns_cluster.py`) and the
Ray actors (`launch/ray_cluster.py`), so they cannot drift apart.
"""

import json
import os
import selectors
import subprocess
import sys
import threading
import time

from surge.errors import SurgeError
from surge.runtime.node.context import AgentConfig
from surge.runtime.transport import STALL_TIMEOUT_S


def agent_argv(config: AgentConfig) -> list[str]:
    """`surge node run` for `config` (all but the token)."""
    cmd = [sys.executable, "-m", "surge.cli", "node", "run", "--node-id", str(config.node)]
    cmd += ["--cluster-id", config.cluster_id, "--disk-dir", str(config.disk_dir)]
    cmd += ["--host", config.host, "--port", str(config.port)]
    for flag, gbps in (
        ("--egress-gbps", config.egress_gbps),
        ("--ingress-gbps", config.ingress_gbps),
        ("--remote-gbps", config.remote_gbps),
        ("--disk-gbps", config.disk_gbps),
        ("--pcie-gbps", config.pcie_gbps),
    ):
        if gbps:
            cmd += [flag, str(gbps)]
    if config.remote_dir:
        cmd += ["--remote-dir", str(config.remote_dir)]
    cmd += ["--max-num-seqs", str(config.engine.max_num_seqs)]
    cmd += ["--max-kv-tokens", str(config.engine.max_kv_tokens)]
    if not config.engine.fuse_projections:
        cmd.append("--no-fuse-projections")
    cmd.append("--compile-decode" if config.engine.compile_decode else "--no-compile-decode")
    cmd += ["--compile-quiet-s", repr(config.engine.compile_quiet_s)]
    cmd += ["--compile-defer-max-s", repr(config.engine.compile_defer_max_s)]
    if config.engine.device != "auto":
        cmd += ["--device", config.engine.device]
    if not config.preload_engine:
        cmd.append("--no-preload-engine")
    if not config.pace_links:
        cmd.append("--no-pace-links")
    if config.host_group is not None:
        cmd += ["--host-group", config.host_group]
        cmd += ["--host-mates", ",".join(map(str, config.host_mates))]
    if config.host_gbps:
        cmd += ["--host-gbps", str(config.host_gbps)]
    if config.emulate is not None and config.emulated_gpu is not None:
        cmd += ["--emulate", config.emulate, "--emulated-gpu", config.emulated_gpu]
        cmd += ["--time-dilation", repr(config.time_dilation)]
    if config.tls is not None:
        cmd += config.tls.argv()
    if config.allow_plain:
        cmd.append("--allow-plain")
    if config.stall_timeout_s != STALL_TIMEOUT_S:
        cmd += ["--stall-timeout-s", repr(config.stall_timeout_s)]
    if config.fault_corrupt_sends:
        cmd += ["--fault-corrupt-sends", str(config.fault_corrupt_sends)]
    if config.fault_shm_free_bytes is not None:
        cmd += ["--fault-shm-free-bytes", str(config.fault_shm_free_bytes)]
    return cmd


LAUNCHER_PID_ENV = "SURGE_LAUNCHER_PID"
"""The launching process's pid, in the agent's environment: the agent exits once its parent
is no longer that process (`NodeAgent.serve_forever`) — even when the launcher died before
the agent could look (a parent pid read at that point would already be init's)."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID runs (a launcher's, for sweeping what a dead one left)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def local_agent_threads(num_agents: int, threads_per_agent: int | None = None) -> int:
    """Compute threads of each of `num_agents` agents started on this machine:
    `threads_per_agent` if given, else its cores shared out (at least 1). What `LocalCluster`
    gives its agents, and so what an engine step profile for them is taken with
    (`runtime/step_profiles.py`: a CPU step's time depends on its threads)."""
    return threads_per_agent or max(1, (os.cpu_count() or 1) // num_agents)


def agent_env(token: str, threads: int | None = None) -> dict[str, str]:
    """The agent's environment: the cluster token, this (launching) process's pid, and its
    compute threads if given."""
    env = {**os.environ, "SURGE_TOKEN": token, LAUNCHER_PID_ENV: str(os.getpid())}
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def spawn_agent(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start one agent process in a process group of its own: a terminal's Ctrl-C (SIGINT
    to the foreground group) reaches the launcher only, which stops its agents itself
    (SIGTERM; each unlinks its shared memory), whatever state it is in. An agent whose
    launcher dies exits on its own (`LAUNCHER_PID_ENV`)."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, process_group=0)


def _busy() -> str:
    """Why an agent may start slowly here: this machine's load, when it exceeds its CPUs
    (agents' stderr is the launcher's: there is no log file of theirs to point at)."""
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    return f" (this machine is busy: load average {load:.1f} on {cpus} CPUs)" if load > cpus else ""


def wait_ready(
    node: int, proc: subprocess.Popen, deadline: float, abort: threading.Event | None = None
) -> int:
    """The port the agent reports on its ready line (before `deadline`, time.monotonic);
    gives up (`SurgeError`) within a poll once `abort` is set."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if abort is not None and abort.is_set():
                raise SurgeError(f"node agent {node}: the cluster was stopped while it started")
            if proc.poll() is not None:
                raise SurgeError(f"node agent {node} exited with {proc.returncode} at start")
            if sel.select(timeout=0.2):
                line = proc.stdout.readline()
                if line:
                    msg = json.loads(line)
                    if msg.get("ready"):
                        return int(msg["port"])
        raise SurgeError(f"node agent {node} did not start in time{_busy()}; whatever it "
                         "printed is above; retry, or start fewer agents (--nodes)")  # fmt: skip
    finally:
        sel.close()
