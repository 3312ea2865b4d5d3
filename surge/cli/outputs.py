"""Files and directories the CLI writes (`--png`, `--json`, `--timeline`; `--state-dir`,
`--disk-dir`, `surge node certs OUT_DIR`): checked before any work starts, so a path that
cannot be written is one `error:` line at once, not a traceback after a long run (issue 36:
`surge plan multicast --png /nonexistent/dir/x.png`). Owned by the CLI."""

import os
from pathlib import Path

from surge.errors import SurgeError


def check_output_file(path: Path | None, flag: str) -> None:
    """Raise `SurgeError` unless `path` (when given) can be created or replaced."""
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise SurgeError(f"{flag} {path} is a directory; give a file name")
    if not parent.is_dir():
        raise SurgeError(f"{flag} {path}: the directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SurgeError(f"{flag} {path} cannot be written here; choose a writable directory")


def make_writable_dir(path: Path, flag: str) -> None:
    """Create directory `path` (and its parents) and check it is writable, or one
    `SurgeError` line naming `flag` (a FileNotFoundError traceback before: `surge node run
    --disk-dir /proc/x/d`, `surge node certs /proc/x`)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise SurgeError(
            f"{flag} {path} cannot be used ({e.strerror}); give a writable directory"
        ) from None
