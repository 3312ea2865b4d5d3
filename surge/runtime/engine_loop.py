"""The loop that drives one `LLMEngine`: work in at step boundaries, steps in a thread,
token events out.

What flows: `admit()` adds the work that arrived since the last step (requests, adopted
sequences) — it runs on the event loop between steps, never during one; each step runs
in a worker thread (`asyncio.to_thread`) so the event loop keeps serving I/O; its
`TokenEvent`s go to `deliver`. Finished sequences are dropped from the engine here (the
engine keeps a sequence until its owner takes it out), so callers never reach into
`engine.seqs`. Idle, the loop sleeps on `wake`. An exception from a step ends the loop
(the caller decides what a failed step means). Used by the runtime's pipeline heads
(`runtime/endpoints.py`); the agent's local instances can drive theirs the same way.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from surge.engine.llm_engine import LLMEngine, TokenEvent


async def run_engine(
    engine: LLMEngine,
    wake: asyncio.Event,
    admit: Callable[[], None],
    deliver: Callable[[list[TokenEvent]], Awaitable[None]],
    gate: Callable[[], AbstractAsyncContextManager[None]] | None = None,
) -> None:
    """Drive `engine` until cancelled or a step raises (see the module docstring). Each
    step runs inside `gate()` if given (FlexPipe's step gate: no step while a refactoring
    switches stages), with a last `admit()` for work that came while it was closed."""
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
            events = await asyncio.to_thread(engine.step)
        for ev in events:
            if ev.finished:
                engine.seqs.pop(ev.seq_id, None)
        await deliver(events)
