"""What `surge model import` checks before it reads a weight or imports torch: which kind of
source it is given, the source's shape against `--blocks` (and `--equal-blocks`), `--dtype`,
and where the store may be written; so a bad call is one `error:` line at once, not after
torch loaded.

What flows: the command's arguments in; a `SurgeError` naming the fix out, or, for an HF
checkpoint, its architecture and block count (which `importer.import_checkpoint` packs
by). Owned by model/; the importers call these same checks when used from code.
"""

from pathlib import Path

from surge.errors import SurgeError
from surge.model.arch import ModelArch, arch_from_hf_config, load_hf_config, with_generation_eos
from surge.model.layout import default_num_blocks, validate_num_blocks
from surge.model.store_dir import check_store_dir

GGUF_MAGIC = b"GGUF"
GGUF_STORE_DTYPES = ("float32", "bfloat16")
"""The dtypes a GGUF may be dequantized to (`--dtype`)."""


def is_gguf(path: Path) -> bool:
    """Whether `path` is a GGUF file (by its magic bytes, whatever its name)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def check_gguf_dtype(dtype: str) -> None:
    if dtype not in GGUF_STORE_DTYPES:
        raise SurgeError(f"--dtype {dtype!r} is not one of {', '.join(GGUF_STORE_DTYPES)}")


def checkpoint_arch(hf_dir: Path, num_blocks: int | None) -> tuple[ModelArch, int]:
    """The architecture of the HF checkpoint in `hf_dir` (its config.json, and the stop ids
    of its generation config) and the block count to cut it into (`num_blocks`, default
    min(layers, 8)), checked."""
    arch = with_generation_eos(arch_from_hf_config(load_hf_config(hf_dir)), hf_dir)
    blocks = default_num_blocks(arch.num_layers) if num_blocks is None else num_blocks
    validate_num_blocks(blocks, arch.num_layers)
    return arch, blocks


def check_import(
    source: Path,
    store_dir: Path,
    num_blocks: int | None,
    overwrite: bool,
    dtype: str,
    equal_blocks: bool = False,
) -> None:
    """Raise `SurgeError` for an import call that cannot succeed, as far as that shows
    without reading weights (a GGUF's layer count is checked against `--blocks` when its
    metadata is read), or that asks for equal blocks of a store that has only one."""
    if source.is_file() and not is_gguf(source):  # else "not a directory; give a HF checkpoint"
        raise SurgeError(
            f"{source} is a file but not a GGUF file (it does not begin with GGUF's magic "
            "bytes: damaged, or another format); give a llama.cpp .gguf file or a Hugging "
            "Face checkpoint directory"
        )
    if is_gguf(source):
        check_gguf_dtype(dtype)
        if num_blocks is not None and num_blocks < 1:
            raise SurgeError(f"--blocks {num_blocks} is out of range: choose 1 or more")
        blocks = num_blocks
    else:
        blocks = checkpoint_arch(source, num_blocks)[1]
    if equal_blocks and blocks == 1:
        raise SurgeError(
            "--equal-blocks pads blocks to one size, and this store has a single block: "
            "choose --blocks 2 or more, or drop --equal-blocks"
        )
    check_store_dir(source, store_dir, overwrite)
