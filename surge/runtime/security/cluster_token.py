"""The cluster token of agents started by something else, and of the controller joining them.

What flows: a token file path (or none) and the environment in, the token out. The token
comes from a file (`--token-file`, e.g. a mounted Kubernetes Secret) or `$SURGE_TOKEN`,
never from a command line (other users of the machine can read those). Owned by the
runtime; `surge node run` and `surge serve --launcher static` both use it.
"""

import os
from pathlib import Path

from surge.errors import SurgeError

TOKEN_ENV = "SURGE_TOKEN"
MIN_TOKEN_CHARS = 16
"""A shorter token is refused: it would be guessable."""


def resolve_token(token_file: Path | None, who: str) -> str:
    """The token from `token_file` if given, else `$SURGE_TOKEN`; one `SurgeError` naming
    the fix otherwise. `who` names the caller in the message ("an agent")."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = getattr(e, "strerror", None) or e
            raise SurgeError(f"--token-file {token_file} cannot be read ({reason})") from None
        source = f"--token-file {token_file}"
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        source = f"${TOKEN_ENV}"
        if not token:
            raise SurgeError(
                f"set {TOKEN_ENV} (or give --token-file) to the cluster's shared token "
                f"before starting {who}"
            )
    if len(token) < MIN_TOKEN_CHARS:
        raise SurgeError(
            f"{source} holds a token of {len(token)} characters; use at least "
            f"{MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 16`)"
        )
    return token
