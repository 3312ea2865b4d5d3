"""The surge and benchmark flags and the SURGE_ variables the docs show are accepted / read
(`tests/docs/reading.py` says what is read and how)."""

import re
from pathlib import Path

from tests.conftest import REPO
from tests.docs.reading import (
    DOCS,
    bench_lines,
    read,
    rel,
    script_parsers,
    script_text,
    sources,
    surge_problems,
    tree,
)


def test_every_surge_flag_the_docs_show_is_accepted() -> None:
    problems = [
        f"{where}: {why}"
        for where, lines in sources()
        for snippet in lines
        for why in surge_problems(snippet)
    ]
    assert not problems, "\n".join(sorted(set(problems)))


def test_every_benchmark_flag_the_docs_show_is_accepted() -> None:
    lines = bench_lines()
    missing = sorted({f"{w}: {p}: no such script" for w, p, _ in lines if not (REPO / p).is_file()})
    assert not missing, "\n".join(missing)
    shown = sorted({p for _, p, fl in lines if fl})
    parsers = script_parsers(tuple(shown))
    problems = []
    for where, path, shown_flags in lines:
        accepted = parsers.get(path)
        if accepted is not None:
            wrong = shown_flags - {*accepted, "--help"}
        else:
            text = script_text(path)
            wrong = {f for f in shown_flags if f not in text}
        if wrong:
            how = "its parser" if accepted is not None else "its text"
            problems.append(f"{where}: {path}: not in {how}: {sorted(wrong)}")
    assert not problems, "\n".join(sorted(set(problems)))


def test_every_environment_variable_the_docs_name_is_read() -> None:
    """Each `SURGE_...` environment variable a doc names appears in the code (surge/, deploy/,
    setup.sh, .ci/, benchmarks/, tests/ but this file, whose docstring names some)."""
    files, _ = tree()
    where = ("surge/", "deploy/", ".ci/", "benchmarks/", "tests/")
    kinds = (".py", ".sh", ".yaml", ".yml", "Dockerfile", ".ci/run")
    this = rel(Path(__file__))
    code = "\n".join(
        read(f)
        for f in files
        if f == "setup.sh" or (f.startswith(where) and f.endswith(kinds) and f != this)
    )
    named = {v for doc in DOCS for v in re.findall(r"\bSURGE_[A-Z0-9_]+\b", doc.read_text())}
    unread = sorted(v for v in named if not re.search(rf"\b{v}\b", code))
    assert not unread, unread
