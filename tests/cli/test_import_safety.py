"""`surge model import` never deletes what a user owns (issue 36): an output that is, contains
or sits inside its input is refused, and `--overwrite` only replaces a store surge wrote."""

import shutil
from pathlib import Path

import pytest

from surge.errors import SurgeError
from surge.model.importer import import_checkpoint
from surge.model.manifest import read_manifest
from surge.model.store_dir import STORE_MARKER
from tests.cli.test_cli import assert_one_line_error
from tests.conftest import run_surge


def _files(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def test_import_into_its_own_checkpoint_is_refused_and_deletes_nothing(
    tiny_hf: Path, tmp_path: Path
) -> None:
    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf, hf)
    before = _files(hf)
    # The same directory (the data-loss case of the issue), through the CLI as a user types it.
    proc = run_surge("model", "import", str(hf), str(hf), "--overwrite", "-q")
    assert_one_line_error(proc, "is the checkpoint", "separate directory")
    assert _files(hf) == before
    # Inside the checkpoint, and containing it (a parent directory), with or without overwrite.
    for out, relation in ((hf / "store", "is inside"), (tmp_path, "contains")):
        for overwrite in (False, True):
            with pytest.raises(SurgeError, match=relation):
                import_checkpoint(hf, out, overwrite=overwrite, progress=False)
    assert _files(hf) == before
    assert not (hf / "store").exists()
    # A symlink to the checkpoint is the checkpoint.
    link = tmp_path / "link"
    link.symlink_to(hf)
    with pytest.raises(SurgeError, match="is the checkpoint"):
        import_checkpoint(hf, link, overwrite=True, progress=False)
    assert _files(hf) == before


def test_overwrite_replaces_only_a_directory_surge_wrote(tiny_hf: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    proc = run_surge("model", "import", str(tiny_hf), str(mine), "--overwrite", "-q")
    assert_one_line_error(proc, "not written by `surge model import`", "remove it yourself")
    assert (mine / "thesis.tex").read_text() == "years of work"

    store = tmp_path / "store"
    import_checkpoint(tiny_hf, store, num_blocks=2, progress=False)
    assert (store / STORE_MARKER).is_file()
    import_checkpoint(tiny_hf, store, num_blocks=3, overwrite=True, progress=False)
    assert read_manifest(store).num_blocks == 3 and (store / STORE_MARKER).is_file()
    # A store from before the marker existed is also not deleted.
    (store / STORE_MARKER).unlink()
    with pytest.raises(SurgeError, match=r"no \.surge-store file"):
        import_checkpoint(tiny_hf, store, num_blocks=2, overwrite=True, progress=False)
    assert read_manifest(store).num_blocks == 3


def test_unwritable_or_file_outputs_are_one_line_errors(tiny_hf: Path, tmp_path: Path) -> None:
    assert_one_line_error(
        run_surge("model", "import", str(tiny_hf), "/proc/surge-store", "-q"),
        "cannot create the store directory",
    )
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SurgeError, match="is a file"):
        import_checkpoint(tiny_hf, f, progress=False)
    assert f.read_text() == "x"
