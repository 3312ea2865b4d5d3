"""Engine step profiles on disk: taken once per model, device and engine settings, then reused.

BlitzScale §5.3 profiles each instance's serving load "offline"; `surge serve` (at deploy
time, `control/deployments.py`, in a child process: `profile_in_child`) and
`surge model profile` take that profile of the real engine here
(`engine/step_profile.measure_steps`) and keep it as one JSON file under
`$SURGE_HOME/profiles/`, keyed by the model's digest (its architecture and every block's
checksum, from the manifest: nothing is read or downloaded), the device (GPU name, or CPU
model and threads), every engine setting, and the torch and surge versions a step's time
depends on. A later deploy of the same model on the same device reads it (milliseconds).
A file that cannot be read or does not parse is reported (one warning) and measured again;
a directory that cannot be written is one `SurgeError` line (the measured profile is still
returned to a caller that asks to go on without saving). Imports torch only to measure.

`surge serve`'s controller never runs the engine itself: `profile_in_child` runs this module
(`python -m surge.runtime.step_profiles STORE DIR ENGINE_JSON`) in a process of its own, so the
controller's event loop keeps its CPU and GIL, and imports neither torch nor CUDA; the child's
progress lines come back line by line, its profile as JSON on its stdout, and it is killed
when the deployment goes (or the controller stops) before it is done. It computes on the
threads one agent's engine has (`threads`: the local launcher's share of the cores, as
`OMP_NUM_THREADS`, the agents' own setting): a CPU step on other threads is another step
(measured on the 2-core VM at load 10, a 32-MB model: 2 threads prefilled 512 tokens in 3.05
s, 1 thread in 0.34 s).
"""

import asyncio
import hashlib
import json
import logging
import os
import sys
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
        return parse_profile(json.dumps(d))
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


def profile_json(profile: StepProfile) -> str:
    return json.dumps({"prefill_s": profile.prefill_s, "decode_s": profile.decode_s})


def parse_profile(text: str) -> StepProfile:
    """A profile from `profile_json`'s text (`ValueError`, `KeyError`, `TypeError` or
    `SurgeError` when it is not one)."""
    d = json.loads(text)
    return StepProfile(
        tuple((int(n), float(s)) for n, s in d["prefill_s"]),
        tuple((int(b), float(s)) for b, s in d["decode_s"]),
    )


async def profile_in_child(
    store: Path,
    config: EngineConfig,
    directory: Path,
    progress: Callable[[str], None],
    threads: int | None = None,
) -> StepProfile:
    """`ensure_profile` of the store at `store` in a child process (module docstring) that
    computes on `threads` (None: torch's default); each of its stderr lines to `progress`; a
    `SurgeError` with its last line if it fails."""
    env = None
    if threads is not None:  # as an agent's (`agent_process.agent_env`)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", __name__, str(store), str(directory), json.dumps(asdict(config)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        start_new_session=True,  # a terminal's Ctrl-C is the controller's to handle
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    last = ""
    try:
        out = asyncio.ensure_future(proc.stdout.read())
        while line := (await proc.stderr.readline()).decode(errors="replace").rstrip():
            last = line
            progress(line)
        text = (await out).decode(errors="replace")
        code = await proc.wait()
    finally:
        if proc.returncode is None:  # cancelled: the deployment went, or the controller stops
            proc.kill()
            await proc.wait()
    if code != 0:
        raise SurgeError(f"the step profile failed (exit {code}): {last or 'no output'}")
    try:
        return parse_profile(text)
    except (ValueError, KeyError, TypeError, SurgeError) as e:
        raise SurgeError(f"the step profile's output is not one ({e})") from None


def main(argv: list[str]) -> int:
    """`python -m surge.runtime.step_profiles STORE DIR ENGINE_JSON` (`profile_in_child`)."""
    from surge.model.manifest import read_manifest

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        store, directory, engine = argv
        config = EngineConfig(**json.loads(engine)).validate()
        profile = ensure_profile(read_manifest(Path(store)), config, Path(directory))
    except (SurgeError, ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(profile_json(profile))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
