"""`surge model create-tiny` and `surge model import` refuse bad arguments before they import
torch (seconds on a loaded machine): each bad call is one `error:` line, exit 2, and torch
never entered the process."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import assert_one_line_error
from tests.conftest import REPO

# Runs the real entry point; at exit (after its `sys.exit(2)`) says whether torch was loaded.
PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, file=sys.stdout))\n"
    "from surge.cli.main import main\n"
    "sys.argv = ['surge', *sys.argv[1:]]\n"
    "main()\n"
)

# "{hf}": the tiny HF checkpoint; "{tmp}": a fresh directory holding "full/" (a file in it)
# and "x.gguf" (GGUF's magic, then nothing a reader could use).
BAD_CALLS = [
    (("create-tiny", "{tmp}/t", "--heads", "0"), "--kv-heads must be >= 1"),
    (("create-tiny", "{tmp}/t", "--kv-heads", "0"), "--kv-heads must be >= 1"),
    (("create-tiny", "{tmp}/t", "--hidden", "130"), "multiple of --heads"),
    (("create-tiny", "{tmp}/t", "--vocab", "10"), "too small"),
    (("create-tiny", "{tmp}/t", "--dtype", "int8"), "float32 or bfloat16"),
    (("create-tiny", "{tmp}/t", "--preset", "huge"), "--preset"),
    (("create-tiny", "{tmp}/full"), "not empty"),
    (("import", "{tmp}/nope", "{tmp}/s"), "not a directory"),
    (("import", "{hf}", "{tmp}/s", "--blocks", "9"), "1 <= blocks <= 4"),
    (("import", "{hf}", "{hf}"), "the checkpoint"),
    (("import", "{hf}", "{tmp}/full"), "not empty"),
    (("import", "{tmp}/x.gguf", "{tmp}/s", "--dtype", "float16"), "dtype 'float16'"),
    (("import", "{tmp}/x.gguf", "{tmp}/s", "--blocks", "0"), "--blocks 0"),
]


@pytest.mark.parametrize(("args", "words"), BAD_CALLS, ids=lambda v: " ".join(v)[:40])
def test_bad_model_calls_are_refused_before_torch(
    args: tuple[str, ...], words: str, tiny_hf: Path, tmp_path: Path
) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("keep me")
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    argv = ["model", *(a.format(hf=tiny_hf, tmp=tmp_path) for a in args)]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert_one_line_error(proc, words)
    assert "torch loaded: False" in proc.stdout, proc.stdout
    assert not (tmp_path / "s").exists() and not (tmp_path / "t").exists()
    assert (tmp_path / "full" / "notes.txt").read_text() == "keep me"
