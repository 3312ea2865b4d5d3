"""From a running request's token ids to the text deltas a client sees.

What flows: the controller appends token ids to a `TrackedRequest` and sets its
`progress`; a `RequestStream` turns each batch of new ids into new text with an
`IncrementalDetokenizer` (vLLM style: only a short window of recent ids is decoded per
step, never the whole output, so a 2,000-token answer costs O(n) decoding, not O(n²)),
cuts it at the first stop string, and holds back what could still be the start of one.
`sse` frames a JSON chunk for Server-Sent Events. Owned by the API layer.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from surge.errors import SurgeError, Unavailable

REPLACEMENT = "\ufffd"
"""What a decoder yields for an incomplete UTF-8 sequence: wait for more tokens."""


class IncrementalDetokenizer:
    """Text of a growing list of token ids, decoding a bounded window per step.

    `prefix_offset..read_offset` are ids already turned into text and kept only as left
    context (a byte-level or sentencepiece decoder may need it to place spaces); the
    text of `ids[prefix_offset:]` minus that of `ids[prefix_offset:read_offset]` is new.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return "".join(f" {t}" for t in ids)
        return self.tokenizer.decode(ids)

    def push(self, new_ids: list[int], final: bool = False) -> str:
        """Append ids; the text they complete (a partial character is held back unless
        `final`)."""
        self.ids.extend(new_ids)
        if self.read_offset == len(self.ids):
            return ""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) <= len(prefix) or (full.endswith(REPLACEMENT) and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]


class StopCutter:
    """Cuts text at the first stop string; holds back a tail that may begin one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.pending = ""

    def push(self, text: str, final: bool) -> tuple[str, bool]:
        """(text to send now, whether a stop string was hit)."""
        buf = self.pending + text  # bounded: pending is at most `hold` characters
        cut = min((i for s in self.stops if (i := buf.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.pending = ""
            return buf[:cut], True
        if final or not self.hold:
            self.pending = ""
            return buf, False
        keep = min(self.hold, len(buf))
        self.pending = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False


@dataclass(frozen=True)
class Delta:
    """New text of one choice and, on its last delta, why it finished."""

    text: str
    finish_reason: str | None
    first_token: int
    """Output position of the first token this delta covers."""
    num_tokens: int
    """Tokens generated so far (the delta covers positions first_token..num_tokens-1)."""


async def _next_event(req: Any) -> None:
    """Wait for a token or the end (a request an endpoint failed only sets `done`)."""
    if req.progress.is_set() or req.done.is_set():
        req.progress.clear()
        return
    waits = [asyncio.ensure_future(req.progress.wait()), asyncio.ensure_future(req.done.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    req.progress.clear()


class RequestStream:
    """The text deltas of one running request (a `TrackedRequest`)."""

    def __init__(self, req: Any, tokenizer: Any, stops: list[str]) -> None:
        self.req = req
        self.detok = IncrementalDetokenizer(tokenizer)
        self.cutter = StopCutter(stops)
        self.read = 0
        self.handed_back = False
        """`finished` was called for its request (by `merged` or `hand_back`)."""
        self.with_logprobs = req.params.logprobs is not None
        """Every token then gets a delta (its logprobs go out even before its text)."""

    async def deltas(self) -> AsyncIterator[Delta]:
        req = self.req
        while True:
            await _next_event(req)
            done = req.done.is_set()
            ids = req.output_token_ids
            new, first = ids[self.read :], self.read
            self.read = len(ids)
            if done and req.finish_reason == "abort":  # ended here, not by the model
                raise Unavailable("the request was aborted before it finished; retry it")
            if done and req.finish_reason == "error":
                exc = getattr(req, "exception", None)  # the controller's reason (hold timeout)
                if isinstance(exc, SurgeError):
                    raise exc
                raise Unavailable(f"the request failed: {getattr(req, 'error', None) or 'error'}")
            text, hit = self.cutter.push(self.detok.push(new, final=done), final=done)
            if hit:
                req.finish("stop_string")
                yield Delta(text, "stop", first, self.read)
                return
            if done:
                reason = req.finish_reason if req.finish_reason in ("stop", "length") else "stop"
                yield Delta(text, reason, first, self.read)
                return
            if text or (new and self.with_logprobs):
                yield Delta(text, None, first, self.read)


async def merged(
    streams: list[RequestStream],
    finished: Callable[[Any, str], None],
    keepalive_s: float | None = None,
) -> AsyncIterator[tuple[int, Delta | None]]:
    """Every choice's deltas as they come, tagged with the choice's index; with
    `keepalive_s`, (-1, None) whenever nothing came for that long. Each request is handed
    to `finished(req, status)` at the end, however it ends (status "ok", "aborted",
    "error" or "cancelled")."""
    status = {id(s): "ok" for s in streams}
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, s: RequestStream) -> None:
        try:
            async for d in s.deltas():
                await queue.put((i, d))
        except Exception as e:
            await queue.put((i, e))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            try:
                async with asyncio.timeout(keepalive_s):
                    i, got = await queue.get()
            except TimeoutError:
                yield -1, None
                continue
            if got is None:
                left -= 1
            elif isinstance(got, BaseException):
                status[id(streams[i])] = "error"
                raise got
            else:
                yield i, got
    except BaseException:
        for s in streams:
            if status[id(s)] == "ok":
                status[id(s)] = "cancelled"
        raise
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            st = status[id(s)]
            if st == "ok" and s.req.finish_reason == "abort":
                st = "aborted"
            if not s.handed_back:
                s.handed_back = True
                finished(s.req, st)


def hand_back(streams: list[RequestStream], finished: Callable[[Any, str], None]) -> None:
    """Hand back the requests `merged` never got to (a client gone before its stream
    started iterating), so none stays ongoing."""
    for s in streams:
        if not s.handed_back:
            s.handed_back = True
            finished(s.req, "cancelled")


def sse(body: dict[str, Any]) -> str:
    """One Server-Sent Events frame."""
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
SSE_KEEPALIVE = ": keep-alive\n\n"
"""An SSE comment: clients ignore it, connections stay open."""
