"""Where an import writes: the checks that keep `surge model import` from deleting what a
user owns, shared by every importer (safetensors today, GGUF beside it).

A path in (the checkpoint), a path out (the store directory); out comes a directory that
exists, is empty and carries `STORE_MARKER`, or a `SurgeError` that says how to fix the call.
Rules (issue 36): the store may not be, contain or sit inside the checkpoint, whatever
`--overwrite` says; `--overwrite` only replaces a directory that carries the marker, i.e.
one an import wrote (a finished store or one an interrupted import left behind).
"""

import shutil
from pathlib import Path

from surge.errors import SurgeError

STORE_MARKER = ".surge-store"
"""Empty file every import writes first into its store directory: proof that surge made it,
so `--overwrite` may delete it. Directories without it are never deleted by surge."""


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or path.is_relative_to(parent)


def check_store_dir(source: Path, store_dir: Path, overwrite: bool) -> None:
    """Refuse (`SurgeError`) a `store_dir` that `prepare_store_dir` may not make into a store
    for `source`; changes nothing."""
    src, out = Path(source).resolve(), Path(store_dir).resolve()
    if _inside(out, src) or _inside(src, out):
        relation = "is" if out == src else "is inside" if _inside(out, src) else "contains"
        raise SurgeError(
            f"the store directory {store_dir} {relation} the checkpoint {source}; "
            f"write the store to a separate directory (e.g. {src.name}-store beside it)"
        )
    if out.exists() and not out.is_dir():
        raise SurgeError(f"{store_dir} is a file, not a directory; choose a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise SurgeError(
                f"{store_dir} is not empty; choose another directory or pass --overwrite"
            )
        if not (out / STORE_MARKER).is_file():
            raise SurgeError(
                f"{store_dir} is not empty and was not written by `surge model import` "
                f"(no {STORE_MARKER} file), so --overwrite will not delete it; choose another "
                f"directory or remove it yourself"
            )


def prepare_store_dir(source: Path, store_dir: Path, overwrite: bool) -> None:
    """Make `store_dir` an empty, marked directory to import `source` into, or refuse."""
    check_store_dir(source, store_dir, overwrite)
    out = Path(store_dir).resolve()
    if out.is_dir() and any(out.iterdir()):  # one an import wrote, and --overwrite
        shutil.rmtree(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / STORE_MARKER).touch()
    except OSError as e:
        raise SurgeError(
            f"cannot create the store directory {store_dir} ({e.strerror}); choose a "
            f"writable directory"
        ) from None
