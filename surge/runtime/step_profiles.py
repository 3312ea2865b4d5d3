"""Engine step profiles on disk: taken once per model, device and engine settings, then reused.

BlitzScale §5.3 profiles each instance's serving load "offline"; `surge serve` (at deploy
time, `control/deployments.py`) and `surge model profile` take that profile of the real
engine here (`engine/step_profile.measure_steps`) and keep it as one JSON file under
`$SURGE_HOME/profiles/`, keyed by the model's digest (its architecture and every block's
checksum, from the manifest: nothing is read or downloaded), the device (GPU name, or CPU
model and threads), every engine setting, and the torch and surge versions a step's time
depends on. A later deploy of the same model on the same device reads it (milliseconds).
A file that cannot be read or does not parse is reported (one warning) and measured again;
a directory that cannot be written is one `SurgeError` line (the measured profile is still
returned to a caller that asks to go on without saving). Imports torch only to measure.
"""

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import surge
from surge.config import EngineConfig
from surge.errors import SurgeError
from surge.model.default_store import surge_home
from surge.model.manifest import Manifest
from surge.policy.blitzscale.monitor import StepProfile

log = logging.getLogger(__name__)

PROFILE_FORMAT = 1
"""Version of the file's layout (a file of another is measured again)."""


def default_profile_dir() -> Path:
    """Where profiles are kept unless told: `$SURGE_HOME/profiles`."""
    return surge_home() / "profiles"


def model_digest(manifest: Manifest) -> str:
    """The model's identity from its manifest: its architecture and every block's checksum
    (two stores of the same weights agree; a re-import with other weights does not)."""
    h = hashlib.sha256(json.dumps(manifest.arch.to_dict(), sort_keys=True).encode())
    for b in manifest.blocks:
        h.update(f"{b.first_layer}:{b.end_layer}:{b.size_bytes}:{b.checksum};".encode())
    return h.hexdigest()


def profile_key(manifest: Manifest, config: EngineConfig, device: str) -> dict[str, Any]:
    """Everything a step's time depends on, as the profile's file records it."""
    import torch  # the caller measures or serves with torch: it is imported already

    return {
        "format": PROFILE_FORMAT,
        "model_digest": model_digest(manifest),
        "device": device,
        "engine": asdict(config),
        "torch": torch.__version__,
        "surge": surge.__version__,
    }


def profile_path(directory: Path, manifest: Manifest, key: dict[str, Any]) -> Path:
    """The key's file: the model's name (for people) and a hash of the whole key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in manifest.name)[:64]
    return directory / f"{safe}-{digest}.json"


def load_profile(path: Path, key: dict[str, Any]) -> StepProfile | None:
    """The profile kept at `path` for `key`; None when there is none, or (one warning) when
    it cannot be read, does not parse or was taken for another key."""
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as e:
        log.warning("step profile %s cannot be read (%s): measuring again", path, e)
        return None
    try:
        d = json.loads(text)
        if d["key"] != json.loads(json.dumps(key)):
            log.warning("step profile %s was taken for another key: measuring again", path)
            return None
        return StepProfile(
            tuple((int(n), float(s)) for n, s in d["prefill_s"]),
            tuple((int(b), float(s)) for b, s in d["decode_s"]),
        )
    except (ValueError, KeyError, TypeError, SurgeError) as e:
        log.warning("step profile %s is damaged (%s): measuring again", path, e)
        return None


def save_profile(path: Path, key: dict[str, Any], profile: StepProfile) -> None:
    """Keep `profile` at `path` (written whole, then renamed: a reader never sees half);
    a `SurgeError` saying so when the directory cannot be written."""
    body = {"key": key, "prefill_s": profile.prefill_s, "decode_s": profile.decode_s}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".profile-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        raise SurgeError(
            f"cannot write the step profile to {path.parent} ({e.strerror or e}); give a "
            "writable profile directory"
        ) from None


def ensure_profile(
    manifest: Manifest,
    config: EngineConfig,
    directory: Path,
    progress: Callable[[str], None] | None = None,
    remeasure: bool = False,
    must_save: bool = False,
) -> StepProfile:
    """The kept profile of `manifest` under `config` on this machine's device, else (or with
    `remeasure`) one measured now and kept. A directory that cannot be written raises with
    `must_save`; else it is one warning and the profile measured serves this process."""
    from surge.engine.step_profile import device_label, measure_steps  # torch: only here

    key = profile_key(manifest, config, device_label(config))
    path = profile_path(directory, manifest, key)
    if not remeasure and (kept := load_profile(path, key)) is not None:
        log.info("step profile of %s: %s", manifest.name, path)
        return kept
    if must_save:  # an unwritable directory is said before the seconds of measuring
        _check_writable(directory)
    profile = measure_steps(manifest, config, progress)
    try:
        save_profile(path, key, profile)
    except SurgeError as e:
        if must_save:
            raise
        log.warning("%s: the profile serves this process only", e)
    return profile


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise SurgeError(
            f"cannot write the step profile to {directory} ({e.strerror or e}); give a "
            "writable profile directory"
        ) from None
