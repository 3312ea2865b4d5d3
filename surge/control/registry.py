"""The registry the agents read models from: `registry/<name>`, a link to a deployment's
store or a store imported from its Hugging Face checkpoint (`prepare_store`), made when the
deployment is created or brought back (`control/deployments.py`). A store is verified when
linked (every block's checksum): a bad one is refused with one error. Owned by control/.
"""

import shutil
import sys
from pathlib import Path

from surge.control.spec import DeploymentSpec
from surge.errors import InvalidInput, SurgeError, shorten
from surge.model.manifest import MANIFEST_NAME, read_manifest, verify_store


def prepare_store(registry: Path, spec: DeploymentSpec) -> None:
    """Put the model in the registry as `registry/<name>` (link a store, import HF)."""
    try:
        prepare_store_at(registry / spec.name, Path(spec.model).expanduser(), spec)
    except OSError as e:  # a path the file system refuses (too long, not readable, ...)
        raise InvalidInput(
            f"model {shorten(spec.model)!r} cannot be read ({e.strerror or e}); give a store "
            "or checkpoint directory on the controller's machine",
            param="model",
        ) from None


def check_model_source(src: Path, shown: str) -> None:
    """Refuse (one `SurgeError` naming `shown`, the path as given) a model that is neither a
    surge store nor a Hugging Face checkpoint directory; a GGUF file is named as such, with
    the import that makes a store of it. `surge serve` calls it before anything starts."""
    if (src / MANIFEST_NAME).is_file() or (src / "config.json").is_file():
        return
    from surge.model.import_checks import is_gguf

    hint = (
        f"; import it first: surge model import {shown} STORE_DIR, then give STORE_DIR"
        if is_gguf(src)
        else ""
    )
    raise SurgeError(
        f"model {shorten(shown)!r} is neither a surge store (manifest.json) nor a "
        f"Hugging Face checkpoint directory (config.json) on the controller's machine{hint}"
    )


def prepare_store_at(target: Path, src: Path, spec: DeploymentSpec) -> None:
    if target.is_symlink():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    check_model_source(src, spec.model)
    if (src / MANIFEST_NAME).is_file():
        # A clear error if it is not a valid store, or if a block is missing or damaged.
        try:
            verify_store(read_manifest(src))
        except SurgeError as e:
            raise InvalidInput(str(e), param="model") from None
        target.symlink_to(src.resolve(), target_is_directory=True)
    else:  # a Hugging Face checkpoint (`check_model_source`)
        from surge.model.importer import import_checkpoint

        # The bar on the server's stderr (a terminal's only): `surge serve --model HF_DIR`
        # imports before it answers, minutes for a large checkpoint (as `surge model import`).
        import_checkpoint(src, target, name=spec.name, progress=sys.stderr.isatty())
