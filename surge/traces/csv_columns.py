"""Reading CSV files column by column with clear errors for wrong columns.

In: a path (plain or .gz) and the columns a loader needs. Out: a dict of column name ->
list of strings. A missing column or a bad row raises `SurgeError` naming the file and
the columns expected, so `surge simulate` can print one line and exit 2.
"""

import csv
import gzip
import io
from pathlib import Path

from surge.errors import SurgeError


def open_text(path: Path) -> io.TextIOBase:
    """Open a CSV for reading; gzip when the name ends in .gz."""
    if not path.is_file():
        raise SurgeError(f"trace file {path} does not exist; give an existing CSV file")
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def read_columns(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, list[str]]:
    """The `required` (and present `optional`) columns of the CSV at `path`, as strings."""
    with open_text(path) as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise SurgeError(f"trace file {path} is empty; it needs a header row") from None
        missing = [c for c in required if c not in header]
        if missing:
            raise SurgeError(
                f"trace file {path} lacks column(s) {', '.join(missing)}; expected "
                f"{', '.join(required)} (got {', '.join(header) or 'no columns'})"
            )
        wanted = [c for c in (*required, *optional) if c in header]
        idx = [header.index(c) for c in wanted]
        cols: dict[str, list[str]] = {c: [] for c in wanted}
        for line_no, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) <= max(idx):
                raise SurgeError(f"trace file {path} line {line_no} has too few fields")
            for c, i in zip(wanted, idx, strict=True):
                cols[c].append(row[i])
    return cols


def to_floats(path: Path, name: str, values: list[str]) -> list[float]:
    """Parse a column of numbers, naming file and column on failure."""
    try:
        return [float(v) for v in values]
    except ValueError as e:
        raise SurgeError(f"trace file {path}: column {name} must be numbers ({e})") from None
