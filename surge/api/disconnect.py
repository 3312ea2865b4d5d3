"""A client that goes away cancels its work at once (issue 36: a non-streamed request whose
client timed out kept an agent busy for 5+ minutes; cancelled streams logged tracebacks).

What flows: the ASGI `receive` channel, watched for `http.disconnect` while a generation
runs; when it comes, the task collecting the answer (or feeding the stream) is cancelled,
so `streaming.merged` hands each request back as "cancelled" and the controller aborts it
on its agent (KV and slot freed) — within a poll of the event loop, not at the next token
or keep-alive. Each cancellation is one INFO line. Owned by the API layer.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

log = logging.getLogger(__name__)
T = TypeVar("T")

CLIENT_GONE_STATUS = 499
"""What the access log records for a request whose client left before its answer (nginx's
"client closed request"); nothing is sent."""


async def until_disconnected(receive: Receive) -> None:
    """Return once the client has gone (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(work: Awaitable[T], receive: Receive) -> tuple[bool, T | None]:
    """Run `work` until it finishes or the client goes away, whichever is first; then
    (True, its result) or (False, None) with `work` cancelled (and awaited)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnected(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request itself is cancelled (the server stops)
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False, None


class CancellableStream(StreamingResponse):
    """A streamed answer whose generator is cancelled the moment its client goes away (or a
    write finds the connection gone), then closed, so its `finally` blocks run now; then
    `on_gone()` is called once. Never raises for a vanished client."""

    def __init__(self, content: Any, on_gone: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.on_gone = on_gone

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stream() -> bool:
            try:
                await self.stream_response(send)
            except OSError:  # a write into a closed connection
                return False
            return True

        try:
            finished, ok = await unless_disconnected(stream(), receive)
        finally:
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
        if not finished or not ok:
            self.on_gone()
        if self.background is not None:
            await self.background()
