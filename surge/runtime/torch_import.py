"""torch in a process that serves without it until a request needs it: the controller, whose
pipeline head engines (`runtime/pipeline_heads.py`) decode greedy requests with no torch
(`engine/sampling.py`, `needs_torch`) and sampled or logprobs ones with it.

What flows: `start()` begins the import once per process, in a daemon thread (seconds of CPU:
~1.5 s idle, ~5-10 s wall on the loaded 2-core VM), and returns its future; `loaded()` says
whether it has finished; `wait()` awaits it from an event loop. Whoever will need torch soon
starts it early (a restart's adoption as soon as an agent reports a pipeline stage, a
pipeline's first head engine), so a sampled request waits for what is left of it and a
greedy one not at all. `import torch` itself is never run on an event loop: the loop would
stop for the whole import. Owned by the runtime.
"""

import asyncio
import concurrent.futures
import importlib
import logging
import sys
import threading
import time

log = logging.getLogger(__name__)

_lock = threading.Lock()
_done: concurrent.futures.Future | None = None
"""The import's outcome (None: not started in this process)."""


def start() -> concurrent.futures.Future:
    """Begin importing torch in a background thread, unless begun already; its future (an
    exception if the import failed, as a later `import torch` would raise it too)."""
    global _done
    with _lock:
        if _done is None:
            _done = concurrent.futures.Future()
            threading.Thread(target=_run, args=(_done,), name="torch-import", daemon=True).start()
        return _done


def loaded() -> bool:
    """Whether torch is imported: the import `start` began has finished, or, none begun,
    something else imported it (an agent's engine, a test)."""
    return _done.done() if _done is not None else "torch" in sys.modules


async def wait() -> None:
    """Wait, without holding the event loop, until torch is imported (begun if need be);
    at once, without yielding, once it is."""
    if not loaded():
        await asyncio.wrap_future(start())


def _run(done: concurrent.futures.Future) -> None:
    t0 = time.monotonic()
    try:
        importlib.import_module("torch")
    except Exception as e:  # whoever waits for it sees why (a later `import torch` too)
        done.set_exception(e)
        return
    log.info("torch imported in the background in %.1f s", time.monotonic() - t0)
    done.set_result(None)
