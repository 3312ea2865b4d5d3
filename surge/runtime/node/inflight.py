"""The ops an agent is running, by the model each is about, so that dropping a model (its
deployment was deleted: `DropModelOp`) aborts them at once instead of waiting for them.

What flows: each dispatched op about a model runs as its own task through `run`, and work
an op leaves running (a multicast's pulls) is `track`ed under its model; `abort`
cancels the tasks of one model and waits (bounded) until their clean-up has run. A caller
still waiting on an aborted op gets a `SurgeError` that says why. Owned by the node agent
(`runtime/node/agent.py`).
"""

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from surge.errors import SurgeError

T = TypeVar("T")


class InFlight:
    """Running ops' tasks by model."""

    def __init__(self) -> None:
        self._tasks: dict[str, set[asyncio.Task]] = {}
        self._why: dict[str, str] = {}
        """Per model, why its ops were last aborted (what their callers are told)."""
        self.on_track: Callable[[], None] | None = None
        """Called as each op or its work starts (the node's compile gate closes at once)."""

    async def run(self, model: str, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` (an op's handler) as a task tracked under `model`; its result. If
        `abort(model)` cancelled it, raise a `SurgeError` (the op's answer); if the caller
        itself is cancelled (the agent closes), the op is cancelled with it."""
        task = self.track(model, asyncio.ensure_future(coro))
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if task.cancelled() and me is not None and not me.cancelling():
                why = self._why.get(model, "was dropped")
                raise SurgeError(f"model {model!r} {why} on this node while this ran") from None
            raise

    def track(self, model: str, task: asyncio.Task) -> asyncio.Task:
        """Count `task` (work an op left running: a multicast's pulls) as about `model`
        until it ends; `task` itself."""
        tasks = self._tasks.setdefault(model, set())
        tasks.add(task)
        if self.on_track is not None:
            self.on_track()

        def done(_: asyncio.Task) -> None:
            tasks.discard(task)
            if not tasks and self._tasks.get(model) is tasks:
                del self._tasks[model]

        task.add_done_callback(done)
        return task

    def busy(self) -> bool:
        """Whether any op about any model runs now (the node is not quiet)."""
        return any(self._tasks.values())

    def count(self, model: str) -> int:
        """Ops about `model` running now."""
        return len(self._tasks.get(model, ()))

    async def abort(self, model: str, timeout_s: float, why: str = "was dropped") -> int:
        """Cancel every op about `model` and wait, `timeout_s` at most, for their clean-up
        (a load stops its reads and removes what it made); how many there were. Their
        callers are told the model `why` ("was dropped", "was replaced by another version")."""
        self._why[model] = why
        tasks = list(self._tasks.get(model, ()))
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        return len(tasks)
