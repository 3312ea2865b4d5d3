"""Bounded intake: what a request may carry before it costs memory or event-loop time.

What flows: the raw ASGI request stream -> `BodyLimit` (a 413 before or while the body is
read, so an oversized body is never buffered) -> the routes, which check a text prompt
against `max_prompt_chars` *before* tokenizing it and tokenize in a worker thread
(`encode_off_loop`), so `/health` and every other request keep answering whatever one request
carries (issue 36: a 300 MB body grew the controller to 18.6 GB; an 8 MB prompt blocked the
event loop for 5 s). Settings: `IntakeLimits`. Owned by the API layer.
"""

import asyncio
import functools
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tokenizers import Tokenizer

from surge.api.error_map import classify
from surge.errors import InvalidInput, SurgeError, TooLarge

DEFAULT_MAX_BODY_BYTES = 16 << 20
"""16 MiB: a prompt filling a 128K-token context as text (~4 bytes a token) or as token ids
(~7 bytes an id) fits; more is refused with a 413 before it is read."""


@dataclass(frozen=True)
class IntakeLimits:
    """What one HTTP request may carry (set by `surge serve --max-body-mb` or the config's
    `max_body_mb`)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Largest request body; a longer one is answered 413 without being buffered."""

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise SurgeError(
                f"max body size {self.max_body_bytes} bytes is too small; allow >= 1 KiB "
                f"(--max-body-mb, default {DEFAULT_MAX_BODY_BYTES >> 20})"
            )


def _too_large(limit: int, what: str) -> TooLarge:
    return TooLarge(
        f"the request body {what} exceeds the server's limit of {limit} bytes; send a "
        f"shorter prompt (the limit is `surge serve --max-body-mb`)"
    )


class BodyLimit:
    """ASGI middleware: a body declared (Content-Length) or found while reading to exceed
    `limit` is answered 413; at most `limit` bytes plus one chunk are ever held."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _answer(_too_large(self.limit, f"of {int(declared)} bytes"), scope, send)
            return
        received, too_big, started = 0, None, False

        async def limited() -> Message:
            nonlocal received, too_big
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:  # chunked: no length declared; stop reading here
                    too_big = _too_large(self.limit, f"(over {received} bytes so far)")
                    raise too_big
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, watched)
        except Exception:
            # Middleware between here and the route may wrap the raise (an ExceptionGroup
            # from a task group): the flag, not the exception's type, says it was ours.
            if too_big is None:
                raise
            if not started:
                await _answer(too_big, scope, send)


async def _answer(e: SurgeError, scope: Scope, send: Send) -> None:
    """Send `e` as its JSON error response without reading the request body."""
    from fastapi.responses import JSONResponse

    status, content, headers = classify(e)
    response = JSONResponse(content, status_code=status, headers={**headers, "Connection": "close"})

    async def nothing() -> Message:  # the body is never read: the connection closes after
        return {"type": "http.disconnect"}

    await response(scope, nothing, send)


MARGIN = 2
"""Headroom of the character bound over its estimate, for normalizers that compose
characters (NFC: two code points, one character) before the pre-tokenizer."""


@functools.lru_cache(maxsize=64)
def chars_per_token_bound(tokenizer: Tokenizer) -> int:
    """The most characters one token can stand for: its longest vocabulary entry (a byte-level
    vocabulary spells each byte as one character, and a text character is >= 1 byte)."""
    return max(1, max((len(t) for t in tokenizer.get_vocab()), default=1)) * MARGIN


def max_prompt_chars(tokenizer: Tokenizer, context_tokens: int) -> int:
    """A text longer than this cannot fit `context_tokens`: refused without tokenizing."""
    return (context_tokens - 1) * chars_per_token_bound(tokenizer)


def check_prompt_chars(
    tokenizer: Tokenizer, text: str, context_tokens: int, param: str = "prompt"
) -> None:
    """A 400 (`context_length_exceeded`) for a text too long for any tokenization to fit."""
    bound = max_prompt_chars(tokenizer, context_tokens)
    if len(text) > bound:
        raise InvalidInput(
            f"the prompt has {len(text)} characters; the model's context of {context_tokens} "
            f"tokens holds at most {bound} of this tokenizer's characters; shorten it",
            param=param,
            code="context_length_exceeded",
        )


async def encode_off_loop(tokenizer: Tokenizer, text: str, special: bool = True) -> list[int]:
    """Token ids of `text`, encoded in a worker thread. `encode_batch` releases the GIL
    while it runs (`encode` does not: a 1 MB text held the event loop for 0.65 s).
    `special`: add the tokenizer's own BOS/EOS (`add_special_tokens`)."""
    encodings = await asyncio.to_thread(tokenizer.encode_batch, [text], add_special_tokens=special)
    return encodings[0].ids
