"""The embedded default model: a tiny random Llama store made on first use.

Lives under `$SURGE_HOME/models/` (default `~/.cache/surge/models/`); created once (a few MB,
about a second), reused afterwards. Used by `surge generate` without a STORE_DIR and by
demos.
"""

import logging
import os
import shutil
import tempfile
from pathlib import Path

from surge.model.importer import import_checkpoint
from surge.model.manifest import MANIFEST_NAME
from surge.model.tiny import TinyModelConfig, create_tiny_model

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "surge-tiny"


def surge_home() -> Path:
    return Path(os.environ.get("SURGE_HOME", Path.home() / ".cache" / "surge"))


def default_store() -> Path:
    """Path of the default tiny store, creating it if missing."""
    store = surge_home() / "models" / DEFAULT_MODEL_NAME
    if (store / MANIFEST_NAME).is_file():
        return store
    log.warning("creating the default tiny model in %s", store)
    store.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a crash never leaves a half-made store.
    with tempfile.TemporaryDirectory(dir=store.parent) as tmp:
        hf_dir = Path(tmp) / "hf"
        create_tiny_model(hf_dir, TinyModelConfig())
        staged = Path(tmp) / "store"
        import_checkpoint(hf_dir, staged, name=DEFAULT_MODEL_NAME, progress=False)
        if store.exists():
            shutil.rmtree(store)
        staged.rename(store)
    return store
