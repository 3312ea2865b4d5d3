"""`surge serve` as a child process, awaited until it is ready: for whatever drives a server
from outside (a benchmark, a test suite, a user's own harness or supervisor).

What flows: `surge serve`'s arguments in; out, the running process and its ready line, the
JSON object `surge/cli/serve.py` prints on stdout once the API listens (`ready`, `url`,
`port`, `nodes`, `models`, `state_dir`). The caller owns the process from then on (stop it
with SIGINT or SIGTERM: it stops its agents). Owned by the CLI.
"""

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from surge.errors import SurgeError

READY_TIMEOUT_S = 120.0
"""How long `start_serve` waits for the ready line by default (agents importing torch on a
loaded machine take tens of seconds)."""


def serve_command(*args: str) -> list[str]:
    """`surge serve ARGS` run by this Python (its environment's surge)."""
    return [sys.executable, "-m", "surge.cli", "serve", *args]


def start_serve(
    args: Sequence[str],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    own_session: bool = False,
    timeout_s: float = READY_TIMEOUT_S,
) -> tuple[subprocess.Popen, dict[str, Any]]:
    """Start `surge serve ARGS`, its stderr to `log_path` (a file: a full pipe would block
    the server), and wait for its ready line; returns the process and that line.

    `own_session`: the server runs in a session and process group of its own with SIGINT's
    default action, as a terminal's job (a parent that ignores SIGINT, e.g. a test runner,
    would pass that on); its Ctrl-C then reaches it alone, and a failed start kills the
    whole group. Raises `SurgeError` (with the log's tail) if the server exits or is not
    ready within `timeout_s`; it is killed then."""
    with open(log_path, "a") as err:
        proc = subprocess.Popen(
            serve_command(*args),
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            cwd=cwd,
            text=True,
            start_new_session=own_session,
            preexec_fn=_default_sigint if own_session else None,
        )
    try:
        return proc, wait_ready(proc, log_path, timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):  # it may have exited already
            if own_session:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
        raise


def wait_ready(proc: subprocess.Popen, log_path: Path, timeout_s: float) -> dict[str, Any]:
    """The ready line of `surge serve` process `proc` (stdout a text pipe), or `SurgeError`
    with the tail of its log if it exits or `timeout_s` passes first."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if sel.select(0.2):
                line = proc.stdout.readline()
                if line.startswith("{"):
                    return json.loads(line)
                if line:
                    continue
            if proc.poll() is not None:
                raise SurgeError(f"surge serve exited {proc.returncode}: {_tail(log_path)}")
        raise SurgeError(f"surge serve not ready within {timeout_s:.0f} s: {_tail(log_path)}")
    finally:
        sel.close()


def _tail(log_path: Path) -> str:
    try:
        return log_path.read_text()[-2000:]
    except OSError:
        return "(no log)"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
