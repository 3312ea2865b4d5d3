"""./setup.sh, the README's one set-up command, refuses a Python surge cannot run on in one
line before it makes anything (it used to make .venv with it, fail in pip's long refusal, and
reuse that .venv on every rerun)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

PY310 = '#!/bin/sh\n[ "$1" = -V ] && echo "Python 3.10.12" && exit 0\nexit 1\n'


def _fake_python(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PY310)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("where", ["PYTHON", ".venv"])
def test_an_unsupported_python_is_one_line(tmp_path: Path, where: str) -> None:
    shutil.copy(REPO / "setup.sh", tmp_path / "setup.sh")
    env = dict(os.environ)
    if where == "PYTHON":
        env["PYTHON"] = str(_fake_python(tmp_path / "bin" / "python3.10"))
    else:
        _fake_python(tmp_path / ".venv" / "bin" / "python")
    proc = subprocess.run(
        ["bash", str(tmp_path / "setup.sh")], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Python 3.11-3.13" in lines[0] and "3.10.12" in lines[0], lines[0]
    assert ("PYTHON=" if where == "PYTHON" else "remove .venv") in lines[0], lines[0]
    if where == "PYTHON":
        assert not (tmp_path / ".venv").exists()
