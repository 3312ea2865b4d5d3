"""Which HTTP status and OpenAI error `type`/`code` each `SurgeError` class gets.

What flows: an exception raised anywhere under a route -> (status, the JSON error body,
extra headers). Chosen by the exception's class, never its message. Used by `app.py`'s
handlers and, for an error that happens after a stream has started, by `openai.py`
(sent as an SSE event). Owned by the API layer.
"""

from typing import Any

from surge.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    Overloaded,
    SurgeError,
    TooLarge,
    Unavailable,
)

ERRORS: list[tuple[type[SurgeError], int, str, str | None]] = [
    (Overloaded, 429, "rate_limit_error", "rate_limit_exceeded"),
    (Unavailable, 503, "server_error", "service_unavailable"),
    (NotFound, 404, "invalid_request_error", "not_found"),
    (Conflict, 409, "invalid_request_error", "conflict"),
    (TooLarge, 413, "invalid_request_error", "request_too_large"),
    (InvalidInput, 400, "invalid_request_error", None),
    (SurgeError, 400, "invalid_request_error", None),
]
"""Exception class -> (HTTP status, OpenAI error type, default code); first match wins."""


def body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_body(e: SurgeError) -> dict[str, Any]:
    return classify(e)[1]


def classify(e: SurgeError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, JSON body, headers) of a `SurgeError`."""
    status, kind, code = next((s, k, c) for cls, s, k, c in ERRORS if isinstance(e, cls))
    out = body(str(e), kind, getattr(e, "param", None), getattr(e, "code", None) or code)
    headers = {}
    retry = getattr(e, "retry_after_s", None)
    if retry is not None:
        headers["Retry-After"] = str(max(1, round(retry)))
    return status, out, headers
