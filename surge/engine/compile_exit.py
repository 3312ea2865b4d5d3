"""Ending a process cleanly while a decode graph compiles (`surge.engine.compiled`).

What flows: `DecodeGraph.start` hands each compile thread to `stop_at_exit`; at interpreter
exit `stop_compiles_at_exit` (registered with atexit) ends them before Python finalizes.
Owned by the engine. Linux's /proc names the compiler processes a thread started; elsewhere
exit waits for the compiler call in flight (seconds) instead.
"""

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
import weakref
from pathlib import Path

log = logging.getLogger(__name__)


class CompileAbandoned(BaseException):
    """Raised into a compile thread as its process exits (`stop_compiles_at_exit`); a
    BaseException, so no `except Exception` in dynamo or inductor swallows it."""


EXIT_GRACE_S = 30.0
"""Most seconds an exiting process waits for its compile thread to unwind (it takes well
under one: see `stop_compiles_at_exit`)."""

LIVE_THREADS: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()
"""Compile threads of this process that may still run (`stop_compiles_at_exit` ends them)."""


def stop_compiles_at_exit() -> None:
    """End running compile threads before the interpreter finalizes (registered with atexit).

    Why: a daemon thread still inside dynamo when Python finalizes is unwound by
    `pthread_exit`, and dynamo's frame guard calls back into the dead interpreter: the
    process died with SIGSEGV or SIGABRT at exit (a short `surge generate`, a test's stage
    process). Joining it instead would hold exit for the whole compile (a minute or more
    cold). So the thread gets `CompileAbandoned` raised at its next bytecode and unwinds
    through dynamo while the interpreter is alive; a C++ compiler it waits on (inductor runs
    g++ from the thread, and reads its output) is killed, by PID, so the wait ends at once.
    The on-disk cache keeps the graphs that finished."""
    for thread in list(LIVE_THREADS):
        if thread.ident is None or not thread.is_alive():
            continue
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(CompileAbandoned)
        )
        deadline = time.monotonic() + EXIT_GRACE_S
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.1)
            if thread.is_alive() and thread.native_id is not None:
                kill_process_trees(children_of_thread(thread.native_id))
        if thread.is_alive():
            log.warning("a decode-graph compile did not stop within %.0f s of exit", EXIT_GRACE_S)


def children_of_thread(native_id: int) -> list[int]:
    """PIDs of the processes this process's thread `native_id` started and that still run
    (Linux's /proc; elsewhere none, and exit waits for the compiler call instead)."""
    try:
        return [int(p) for p in Path(f"/proc/self/task/{native_id}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def kill_process_trees(pids: list[int]) -> None:
    """SIGKILL these processes and every process under them (a compiler driver's cc1plus
    holds the output pipe its caller reads)."""
    tree, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        tree.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                todo += [int(p) for p in (task / "children").read_text().split()]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop_at_exit(thread: threading.Thread) -> None:
    """End `thread` (a compile thread about to start) if it still runs when the process
    exits."""
    # Registered (again) at each start: atexit runs the latest first, so the threads stop
    # before handlers registered meanwhile (inductor's) tear down what they use.
    atexit.unregister(stop_compiles_at_exit)
    atexit.register(stop_compiles_at_exit)
    LIVE_THREADS.add(thread)
