"""`surge serve --model HF_DIR` (or POST /v1/deployments of one) imports the checkpoint into
the registry before it answers: minutes for a large one. On a terminal that import shows the
same progress bar as `surge model import`; elsewhere (a log file, a test) nothing."""

import io
import sys
from pathlib import Path

import pytest

from surge.control.registry import prepare_store_at
from surge.control.spec import DeploymentSpec
from surge.model.manifest import MANIFEST_NAME


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_a_checkpoints_import_shows_a_bar_on_a_terminal_only(
    tiny_hf: Path, tmp_path: Path, monkeypatch, tty: bool
) -> None:
    err = _Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    spec = DeploymentSpec.from_json({"name": "m", "model": str(tiny_hf)})
    prepare_store_at(tmp_path / "m", tiny_hf, spec)
    assert (tmp_path / "m" / MANIFEST_NAME).is_file()
    shown = err.getvalue()
    assert ("import: 100%" in shown) is tty, shown
