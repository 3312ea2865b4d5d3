"""A logging level the user gives (`surge node run --log-level`, a config file's `log_level`):
checked once, one `error:` line naming the levels, never logging's ValueError traceback
(`--log-level verbose` was one, after the agent's flags were read). Owned by the CLI."""

from surge.errors import SurgeError

LEVELS = ("debug", "info", "warning", "error", "critical")
"""Python logging's named levels, as surge's flags spell them."""


def log_level(value: str, where: str) -> str:
    """`value` as logging takes it ("INFO"), or a `SurgeError` naming `where` and the levels."""
    if not isinstance(value, str) or value.lower() not in LEVELS:
        raise SurgeError(f"{where} must be one of {', '.join(LEVELS)} (got {value!r})")
    return value.upper()
