"""The paths, modules, placed names and tree the docs name exist (`tests/docs/reading.py`
says what is read and how)."""

import re

from tests.conftest import REPO
from tests.docs.reading import (
    DOCS,
    FENCE,
    LINK,
    PACKAGES,
    PATH_TOKEN,
    ROOTS,
    SKIP,
    dotted_problem,
    ends_a_path,
    name_in,
    path_problem,
    placed_names,
    rel,
    sources,
    tree,
)


def test_every_path_the_docs_name_exists() -> None:
    problems = []
    for where, lines in sources():
        for snippet in lines:
            for token in PATH_TOKEN.findall(snippet):
                why = path_problem(token, vague=where.endswith(".md"))
                if why:
                    problems.append(f"{where}: {token}: {why}")
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            target = target.split("#")[0]
            local = target and "://" not in target and not target.startswith("mailto:")
            if local and not (doc.parent / target).exists():
                problems.append(f"{rel(doc)}: link {target}: no such path")
    assert not problems, "\n".join(sorted(set(problems)))


def test_every_name_the_docs_place_in_a_file_is_there() -> None:
    """Where the docs say a function or class lives, it is there: Name (its last dotted part,
    `Server.dispatch` -> dispatch) is in that file (a table row: in one of its files)."""
    files, _ = tree()
    problems = []
    for doc in DOCS:
        for paths, name in placed_names(doc.read_text()):
            found = [
                f
                for path in paths
                for f in ([path] if path.startswith(ROOTS) else ends_a_path(path, files))
                if f.endswith(".py") and (REPO / f).is_file()
            ]
            if found and not name_in(name.split(".")[-1], found):
                problems.append(f"{rel(doc)}: {paths} `{name}`: not in {sorted(found)}")
    assert not problems, "\n".join(sorted(set(problems)))


def test_every_surge_module_the_docs_name_exists() -> None:
    dotted = re.compile(rf"(?<![\w/.-])(?:surge|{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+")
    problems = []
    for where, lines in sources():
        for snippet in lines:
            for name in dotted.findall(snippet):
                if name in SKIP:
                    continue
                if not name.startswith("surge."):
                    name = "surge." + name  # `policy.autoscale.decide`: under surge/
                why = dotted_problem(name)
                if why:
                    problems.append(f"{where}: {name}: {why}")
    assert not problems, "\n".join(sorted(set(problems)))


def test_architecture_names_every_folder_of_surge() -> None:
    """docs/architecture.md's tree (its fenced block opening with `surge/`) lists exactly the
    folders and top-level modules of surge/: none missing, none gone."""
    text = (REPO / "docs" / "architecture.md").read_text()
    (block,) = [m.group(3) for m in FENCE.finditer(text) if m.group(3).startswith("surge/")]
    listed, parents = set(), {0: "surge"}
    for line in block.splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        name = line.split()[0] if line.strip() else ""
        if indent >= 20 or not name.endswith(("/", ".py")):
            continue  # a role's continuation line
        path = f"{parents[indent - 2]}/{name.rstrip('/')}"
        parents[indent] = path
        listed.add(path)
    folders = {rel(p) for p in (REPO / "surge").rglob("*") if p.is_dir()}
    modules = {rel(p) for p in (REPO / "surge").glob("*.py") if p.name != "__init__.py"}
    actual = {f for f in folders if not f.endswith("__pycache__")} | modules
    assert listed == actual, f"missing: {sorted(actual - listed)}; gone: {sorted(listed - actual)}"
