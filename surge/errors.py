"""User-facing errors: anything a user can fix raises `SurgeError` with a one-line message.

The CLI turns a `SurgeError` into `error: <message>` on stderr and exit code 2; anything
else is a bug and keeps its traceback.
"""


class SurgeError(Exception):
    """A problem the user can fix; the message says what is wrong and how to fix it."""
