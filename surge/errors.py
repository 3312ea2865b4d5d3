"""User-facing errors: anything a user can fix raises `SurgeError` with a one-line message.

The CLI turns a `SurgeError` into `error: <message>` on stderr and exit code 2; anything
else is a bug and keeps its traceback. The HTTP API maps each class (never the message
text) to a status and OpenAI's error `type`/`code` (`surge/api/app.py`): a plain
`SurgeError` or `InvalidInput` is 400, `NotFound` 404, `Conflict` 409,
`TooLarge` 413, `Unavailable` 503.
"""

SHOWN_CHARS = 100
"""How much of a user-supplied string (a model name, a path) an error message repeats."""


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text`, or its start and its length when longer than `limit`: error messages stay
    bounded whatever a request carries (a 1 MB model name is not echoed back)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class SurgeError(Exception):
    """A problem the user can fix; the message says what is wrong and how to fix it."""


class InvalidInput(SurgeError):
    """The request itself is wrong (HTTP 400). `param` names the offending field, `code`
    is OpenAI's error code (e.g. "context_length_exceeded", "invalid_token")."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


class NotFound(SurgeError):
    """What the request names does not exist (HTTP 404)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


class TooLarge(SurgeError):
    """The request is larger than the server accepts (HTTP 413)."""


class Conflict(SurgeError):
    """The request clashes with what exists (HTTP 409), e.g. a name already taken."""


class Unavailable(SurgeError):
    """Cannot be served now; retrying later may work (HTTP 503). `retry_after_s`, when set,
    becomes the `Retry-After` header."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Overloaded(Unavailable):
    """Too many requests are waiting already (HTTP 429 with `Retry-After`)."""
