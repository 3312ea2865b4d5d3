"""The loop that drives one `LLMEngine`: work in at step boundaries, steps in a thread,
token events out.

What flows: `admit()` adds the work that arrived since the last step (requests, adopted
sequences) — it runs on the event loop between steps, never during one; each step runs
in a worker thread (`asyncio.to_thread`) so the event loop keeps serving I/O; its
`TokenEvent`s go to `deliver`. Finished sequences are dropped from the engine here
(`LLMEngine.release`: the engine keeps a sequence until its owner takes it out). Idle, the
loop sleeps on `wake`. An exception from a step goes to `on_failed_step` (which decides what
a failed step means and the loop goes on), or ends the loop when there is none. The one
engine loop of the runtime: pipeline heads (`runtime/endpoints.py`) and the agent's local
instances (`runtime/node/instance_loop.py`, whose step also parks P/D prefills).

The engine's types are for the type checker only: this loop needs nothing of the engine's
modules (which import no torch either: a pipeline's head engines run in the controller,
whose last stage picks the tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from surge.engine.llm_engine import LLMEngine, TokenEvent


async def run_engine(
    engine: LLMEngine,
    wake: asyncio.Event,
    admit: Callable[[], None],
    deliver: Callable[[list[TokenEvent]], Awaitable[None]],
    gate: Callable[[], AbstractAsyncContextManager[None]] | None = None,
    step: Callable[[], list[TokenEvent]] | None = None,
    on_failed_step: Callable[[Exception], Awaitable[None]] | None = None,
) -> None:
    """Drive `engine` until cancelled (or a step raises with no `on_failed_step`; see the
    module docstring). Each step runs inside `gate()` if given (FlexPipe's step gate: no
    step while a refactoring switches stages), with a last `admit()` for work that came
    while it was closed. `step` replaces `engine.step` (it runs in the worker thread)."""
    step = step or engine.step
    while True:
        admit()
        if not engine.has_unfinished:
            wake.clear()
            admit()  # work that arrived between the check and the clear
            if not engine.has_unfinished:
                await wake.wait()
            continue
        async with gate() if gate is not None else contextlib.nullcontext():
            if gate is not None:
                admit()
            try:
                events = await asyncio.to_thread(step)
            except Exception as e:
                if on_failed_step is None:
                    raise
                await on_failed_step(e)
                continue
        for ev in events:
            if ev.finished:
                engine.release(ev.seq_id)
        await deliver(events)
