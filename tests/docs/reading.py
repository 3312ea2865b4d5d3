"""What the docs tests (tests/docs/test_paths.py, test_commands.py) read, and how. The docs
are true to the code: README.md, docs/*.md, benchmarks/**/README*.md and the module
docstrings under surge/ and benchmarks/. Sessions moved files (one folder per concern) and
renamed flags; the docs drifted. Here, in their code spans and fenced blocks (docstrings: their
whole text):

- every repository path they name exists: `surge/...`, `benchmarks/...`, `tests/...`,
  `docs/...`, `deploy/...`, `.ci/...` exactly; a relative `node/store.py` or
  `runtime/scaleout/` as the end of some file's or folder's path; a bare `store.py` as some
  file's name; a `control/load_monitor.pool_load` as a module holding that name; markdown
  links too; and where a doc says "`file.py` `Name`", Name is in that file;
- every dotted `surge.x.y` (or `policy.x`, `runtime.x`, `control.x`, `sim.x`) resolves to a
  module, and a name after it appears in that module;
- every `--flag` of a `surge <command> ...` they show is an option of that command (the typer
  app of surge/cli, walked in this process as tests/deploy does: no process per flag);
- every `--flag` of a `python benchmarks/....py` or `python -m benchmarks....` line is an
  option of that script's argparse parser, captured as it is built (one child process runs
  each script as __main__ up to its first parse and no further), else a string of the script
  or of a benchmarks module it imports;
- docs/architecture.md's tree lists exactly surge/'s folders and top-level modules;
- every `SURGE_...` environment variable they name is read by the code.

Flags must be spelled whole (argparse would also take an unambiguous prefix). What is
deliberately not a path is in SKIP, each with why. No network, no model; the parsers' child
process is most of the time (~20 s: the scripts' imports)."""

import ast
import json
import re
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import typer

from surge.cli.main import app
from tests.conftest import REPO

DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "benchmarks").rglob("README*.md")),
]
DOCSTRING_ROOTS = ("surge", "benchmarks")
ROOTS = ("surge/", "benchmarks/", "tests/", "docs/", "deploy/", ".ci/")
# Not part of the tree: virtualenvs (.venv, .venv-py312, .venv-vllm, ...), caches.
IGNORED_DIRS = {".git", "__pycache__", ".hypothesis", ".ruff_cache", ".pytest_cache"}

# Names that look like paths or modules but deliberately are not (each says why); a path's
# first part here skips every path under it.
SKIP = {
    "surge.access",  # a logger's name (api/app.py), not a module
    "sim.no_busy_merges",  # a key of FlexPipe's results JSON (docs/flexpipe.md), not a module
    "pki",  # docs/deploy.md: what `surge node certs pki` writes on the user's machine
    "deploy/pki",  # docs/deploy.md: the same, written beside the manifests before a build
    "deploy/token",  # docs/deploy.md: a token file the user makes (`openssl rand`)
    "registry",  # the state directory's `registry/` (control/registry.py), made at run time
    "burstgpt",  # a trace file under `--traces-dir` (docs/simulator.md), not in the repository
    # benchmarks/gpu_check.py's output, written on a GPU machine; docs/gpu.md says it has not run
    "benchmarks/results/gpu_check.json",
}
# surge's packages: a dotted `policy.autoscale.decide` is `surge.policy.autoscale.decide`.
PACKAGES = ("policy", "runtime", "control", "sim")
# Extensions that make `a/b.ext` a file, not `a/b` module + attribute `ext`.
FILE_EXTS = {
    "py", "md", "json", "jsonl", "yaml", "yml", "sh", "txt", "png", "csv", "jinja", "bin",
    "toml", "cpp", "js", "html", "css", "gguf", "sqlite", "pem", "key", "log", "cfg",
}  # fmt: skip

# --------------------------------------------------------------------------- extraction

FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})[^\n]*\n(.*?)^\1\2[ \t]*$", re.M | re.S)
SPAN = re.compile(r"``(.+?)``|`([^`]+)`", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def snippets(text: str) -> list[str]:
    """A markdown text's fenced blocks (one snippet per logical line: `\\` continues it) and
    inline code spans (newlines inside one are spaces)."""
    out: list[str] = []
    for m in FENCE.finditer(text):
        out += m.group(3).replace("\\\n", " ").splitlines()
    rest = FENCE.sub("", text)
    out += [" ".join((a or b).split()) for a, b in SPAN.findall(rest)]
    return out


@cache
def docstrings() -> dict[str, str]:
    """Module docstrings by file (relative path)."""
    out = {}
    for root in DOCSTRING_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text()))
            if doc:
                out[rel(path)] = doc
    return out


def sources() -> list[tuple[str, list[str]]]:
    """(where, snippets) for every doc and module docstring (a docstring's are its lines)."""
    out = [(rel(doc), snippets(doc.read_text())) for doc in DOCS]
    out += [(where, doc.splitlines()) for where, doc in docstrings().items()]
    return out


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


# --------------------------------------------------------------------------- the tree


@cache
def tree() -> tuple[frozenset[str], frozenset[str]]:
    """(files, folders) of the repository, as relative posix paths."""
    files, dirs = set(), set()

    def walk(d: Path) -> None:
        for p in d.iterdir():
            if p.name in IGNORED_DIRS or p.name.startswith(".venv") or p.suffix == ".egg-info":
                continue
            if p == REPO / "shared":  # data beside the code where a checkout has it
                continue
            if p.is_dir() and not p.is_symlink():
                dirs.add(rel(p))
                walk(p)
            else:
                files.add(rel(p))

    walk(REPO)
    return frozenset(files), frozenset(dirs)


@cache
def suffixes() -> dict[str, list[str]]:
    """Every trailing part of every path (`node/store.py`, `store.py`) -> the paths it ends."""
    files, dirs = tree()
    out: dict[str, list[str]] = {}
    for path in files | dirs:
        parts = path.split("/")
        for i in range(len(parts)):
            out.setdefault("/".join(parts[i:]), []).append(path)
    return out


def ends_a_path(suffix: str, paths: frozenset[str]) -> list[str]:
    return [p for p in suffixes().get(suffix, []) if p in paths]


@cache
def folder_names() -> frozenset[str]:
    return frozenset(d.rsplit("/", 1)[-1] for d in tree()[1])


@cache
def read(path: str) -> str:
    return (REPO / path).read_text()


def name_in(name: str, files: list[str]) -> bool:
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    return any(pattern.search(read(f)) for f in files)


# A path-like word; not one right after a `:` (`git show REV:path`: a path at a revision).
PATH_TOKEN = re.compile(r"(?<![\w.~$<>*/:-])[\w.~$<>*/-]+")


def path_problem(token: str, vague: bool = True) -> str | None:
    """Why `token` names no path of this repository (None: it does, or it is no path).
    `vague`: also an `a/b` without an extension whose `a` is a folder's name (in code spans;
    not in docstrings' prose: "node/tier")."""
    token = token.rstrip(".,:;").removeprefix("./")
    if any(token.rstrip("/") == s or token.startswith(s + "/") for s in SKIP):
        return None
    if "/" not in token and not token.endswith((".py", ".md")):
        return None
    if re.search(r"[~$<>*]|://|^[/.-]", token) and not token.startswith(".ci/"):
        return None  # absolute, home, variable, placeholder (<name>), URL or glob
    files, dirs = tree()
    if any(placeholder(part) for part in token.split("/")):
        return None  # STORE_DIR/, profiles/scenarios/NAME.json
    rooted = token.startswith(ROOTS)  # `benchmarks/...`: surely meant as a path
    if rooted and (token.rstrip("/") in files or token.rstrip("/") in dirs):
        return None
    first = token.split("/")[0]
    missing = "no such path" if rooted else "no file or folder ends so"
    if token.endswith("/"):
        if not rooted and first not in folder_names():
            return None  # "T_k/" in a formula
        return None if ends_a_path(token.rstrip("/"), dirs) else "no folder ends so"
    if "/" not in token:  # a bare file name
        return None if ends_a_path(token, files) else "no such file"
    head, _, last = token.rpartition("/")
    stem, dot, attr = last.partition(".")
    if not re.fullmatch(r"[A-Za-z_][\w.]*(/[\w.-]+)*", head) or not stem.isidentifier():
        return None  # numbers (0.43/0.28), units (tokens/s), ...
    if not dot:  # `a/b`: a path without its extension (`.py`, or `x.{json,png}`)
        if not rooted and (not vague or first not in folder_names()):
            return None
        found = suffixes().get(token) or [
            f for ext in FILE_EXTS for f in ends_a_path(f"{token}.{ext}", files)
        ]
        return None if found else missing
    if attr.rsplit(".", 1)[-1] in FILE_EXTS:
        return None if ends_a_path(token, files) else missing
    modules = ends_a_path(f"{head}/{stem}.py", files)  # `a/b.name`: module b holds name
    if not modules:
        return "no module ends so"
    name = attr.split(".")[0]
    return None if name_in(name, modules) else f"{name!r} is not in {modules}"


def placeholder(part: str) -> bool:
    """STORE_DIR, NAME.json: a capitalised word no file or folder of the tree is named."""
    stem = part.split(".")[0]
    return (
        len(stem) > 1
        and re.fullmatch(r"[A-Z][A-Z0-9_]*", stem) is not None
        and not (suffixes().get(part))
    )


def dotted_problem(dotted: str) -> str | None:
    """Why `surge.x.y[.name]` resolves to no module (and name in it)."""
    parts = dotted.split(".")
    path = REPO / parts[0]
    for i, part in enumerate(parts[1:], start=1):
        if (path / part / "__init__.py").is_file():
            path = path / part
        elif (path / f"{part}.py").is_file():
            path = path / f"{part}.py"
        else:
            module = path / "__init__.py" if path.is_dir() else path
            if i == 1 or not name_in(part, [rel(module)]):
                return f"no module {'.'.join(parts[: i + 1])} and no {part!r} in {rel(module)}"
            return None
    return None


# --------------------------------------------------------------------------- commands

# A command line ends at a shell pipe (`\|` is a markdown table's escaped bar), an `&&`, a
# `;`, a backtick (a docstring's span), a redirection or a comment.
COMMAND_END = re.compile(r"(?<!\\)\||&&|;|`|\s>|\s#")
SURGE = re.compile(r"(?:^|(?<=[\s(])|(?<=bin/))surge(?=[ \t]+\S)")
BENCH = re.compile(
    r"(?:^|(?<=[\s(/]))python[\d.]*\s+(?:-m\s+(benchmarks(?:\.\w+)+)|(benchmarks/[\w/]+\.py))\b"
)


def command_tail(snippet: str, start: int) -> list[str]:
    return COMMAND_END.split(snippet[start:], maxsplit=1)[0].split()


def flags(words: list[str]) -> set[str]:
    """The `--flags` among a command's words: `[--a B]`, `--a=B`, `--a/--b` (both)."""
    out = set()
    for word in words:
        for part in word.strip("[](),").split("/"):
            flag = part.split("=")[0].strip("[](),.")
            if re.fullmatch(r"--[a-z0-9][\w-]*", flag):
                out.add(flag)
    return out


@cache
def surge_commands() -> dict[tuple[str, ...], tuple[frozenset[str], frozenset[str]]]:
    """Every command path of `surge` (() the root): (its options, its subcommands)."""
    out = {}

    def walk(cmd, path: tuple[str, ...]) -> None:
        opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        subs = getattr(cmd, "commands", {})
        out[path] = (frozenset(opts), frozenset(subs))
        for name, sub in subs.items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return out


def surge_problems(snippet: str) -> list[str]:
    out = []
    commands = surge_commands()
    for m in SURGE.finditer(snippet):
        words = command_tail(snippet, m.end())
        path: tuple[str, ...] = ()
        while words and words[0] in commands[path][1]:
            path, words = (*path, words[0]), words[1:]
        if not path and words and not words[0].startswith("--"):
            # `surge serve: agents` is prose; `surge servee --nodes 2` a wrong command
            if re.fullmatch(r"[a-z][a-z-]*", words[0]) and flags(words):
                out.append(f"`surge {words[0]}` is no command")
            continue
        wrong = flags(words) - commands[path][0]
        if wrong:
            shown = " ".join(("surge", *path))
            out.append(f"not flags of `{shown}`: {sorted(wrong)}")
    return out


# Run in one child process: each script as __main__, stopped at its parser's first parse
# (a script must not run its benchmark here: one that has not parsed within 30 s is left to
# the text fallback). Prints {path: [option strings] or null}.
CAPTURE = textwrap.dedent("""
    import argparse, json, os, runpy, signal, sys

    class Built(BaseException):
        pass

    def stop(parser, *args, **kwargs):
        raise Built(sorted(parser._option_string_actions))

    def late(*args):
        raise TimeoutError

    argparse.ArgumentParser.parse_known_args = stop
    signal.signal(signal.SIGALRM, late)
    out = {}
    for path in sys.argv[1:]:
        sys.argv = [path]
        sys.path.insert(0, os.path.dirname(path))  # as `python PATH` runs it
        signal.alarm(30)
        try:
            runpy.run_path(path, run_name="__main__")
            out[path] = None
        except Built as built:
            out[path] = built.args[0]
        except BaseException:
            out[path] = None
        finally:
            signal.alarm(0)
            sys.path.remove(os.path.dirname(path))
    sys.stdout.flush()
    print("CAPTURED " + json.dumps(out))
""")


@cache
def script_parsers(paths: tuple[str, ...]) -> dict[str, list[str] | None]:
    run = subprocess.run(
        [sys.executable, "-c", CAPTURE, *paths],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (line,) = [ln for ln in run.stdout.splitlines() if ln.startswith("CAPTURED ")]
    return json.loads(line.removeprefix("CAPTURED "))


def script_text(path: str) -> str:
    """The script and the benchmarks modules it imports (shared flag helpers)."""
    source = (REPO / path).read_text()
    texts = [source]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
            module = REPO / (node.module.replace(".", "/") + ".py")
            package = REPO / node.module.replace(".", "/") / "__init__.py"
            texts += [p.read_text() for p in (module, package) if p.is_file()]
    return "\n".join(texts)


def bench_lines() -> list[tuple[str, str, set[str]]]:
    """(where, script path, flags shown) for every benchmark command line in the docs."""
    out = []
    for where, lines in sources():
        for snippet in lines:
            for m in BENCH.finditer(snippet):
                path = m.group(2) or m.group(1).replace(".", "/") + ".py"
                out.append((where, path, flags(command_tail(snippet, m.end()))))
    return out


# --------------------------------------------------------------------------- the tests


def placed_names(text: str) -> list[tuple[list[str], str]]:
    """(files, Name) where a doc says where a name lives: `file.py` `Name` in prose, and a
    table row whose first cell is `a.py`[, `b.py`] and whose second opens with `Name`."""
    text = FENCE.sub("", text)
    out = [
        ([path], name) for path, name in re.findall(r"`([\w/]+\.py)`\s+`([A-Za-z_][\w.]*)`", text)
    ]
    for row in re.findall(r"^\|(.*)$", text, re.M):
        cells = re.split(r"(?<!\\)\|", row)
        if len(cells) < 2:
            continue
        paths = re.findall(r"`([\w/]+\.py)`", cells[0])
        name = re.match(r"\s*`([A-Za-z_][\w.]*)[`(]", cells[1])
        if paths and name and re.fullmatch(r"(\s*`[\w/]+\.py`\s*,?)+", cells[0]):
            out.append((paths, name.group(1)))
    return out
