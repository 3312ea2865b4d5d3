"""The code rules about imports, checked on the source (no module is imported here):
no import cycle among surge's modules, not even through `if TYPE_CHECKING:` or an import
inside a function, and no private name (`_x`) imported from another surge module."""

from __future__ import annotations

import ast
from pathlib import Path

SURGE = Path(__file__).resolve().parents[1] / "surge"


def module_name(path: Path) -> str:
    parts = path.relative_to(SURGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> list[tuple[str, str | None]]:
    """(module, name) for every import in `path` that names a surge module; name is the
    imported name for `from m import name` (None for `import m`)."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    out.append((sub, None))  # `from package import module`
                elif base in modules:
                    out.append((base, alias.name))
    return out


def graph() -> dict[str, list[tuple[str, str | None]]]:
    paths = sorted(SURGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    u = stack.pop()
                    on_stack.discard(u)
                    component.append(u)
                    if u == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    edges = {m: {target for target, _ in found if target != m} for m, found in graph().items()}
    assert cycles(edges) == []


def test_cycle_finder_finds_one() -> None:
    # the checker itself: a two-module cycle and a longer one are found, a chain is not
    edges = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(cycles(edges)) == [["a", "b"], ["c", "d", "e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_private_names_imported_across_modules() -> None:
    private = [
        f"{m} imports {target}.{name}"
        for m, found in graph().items()
        for target, name in found
        if name is not None and name.startswith("_") and not name.startswith("__") and target != m
    ]
    assert private == []


# docs/architecture.md's import rules: (importer's prefix, what it may import or must not).
ALLOWED_ONLY = {
    "surge.policy": ("surge.policy", "surge.errors"),
    "surge.emulation": (
        "surge.emulation", "surge.sim.hardware", "surge.sim.models", "surge.sim.costs",
        "surge.model", "surge.errors",
    ),
    "surge.events": ("surge.errors", "surge.json_codec"),
}  # fmt: skip
NEVER = {
    "surge.sim": ("surge.runtime", "surge.control", "surge.emulation"),
    "surge.runtime": ("surge.control",),
    "surge.engine": ("surge.runtime", "surge.control", "surge.api"),
}


def under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_architecture_import_rules_hold() -> None:
    broken = []
    for m, found in graph().items():
        for target, _ in found:
            for prefix, allowed in ALLOWED_ONLY.items():
                if under(m, (prefix,)) and not under(target, allowed):
                    broken.append(f"{m} imports {target}")
            for prefix, never in NEVER.items():
                if under(m, (prefix,)) and under(target, never):
                    broken.append(f"{m} imports {target}")
    assert broken == []
