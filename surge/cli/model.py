"""`surge model ...`: create tiny checkpoints, import HF checkpoints into block stores, inspect
stores."""

import json
from pathlib import Path
from typing import Annotated

import typer

from surge.cli.model_profile import profile
from surge.errors import SurgeError

app = typer.Typer(help="Create, import, inspect and profile models.", no_args_is_help=True)
app.command("profile")(profile)


@app.command("create-tiny")
def create_tiny(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the HF checkpoint to.")],
    preset: Annotated[
        str, typer.Option(help="Base shape: tiny (~4 MB), 100mb or 500mb (for benchmarks).")
    ] = "tiny",
    layers: Annotated[int | None, typer.Option(help="Decoder layers.")] = None,
    hidden: Annotated[int | None, typer.Option(help="Hidden size.")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads.")] = None,
    kv_heads: Annotated[
        int | None, typer.Option(help="Key/value heads (GQA when < heads).")
    ] = None,
    intermediate: Annotated[int | None, typer.Option(help="MLP intermediate size.")] = None,
    vocab: Annotated[int | None, typer.Option(help="Vocabulary size (>= 258).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    arch: Annotated[str, typer.Option(help="llama or qwen2 (adds q/k/v biases).")] = "llama",
) -> None:
    """Write a Hugging Face Llama checkpoint with random weights (same seed, same bytes)."""
    from surge.model.tiny_shape import check_fits_in_memory, check_shape
    from surge.model.tiny_shape import preset as make_preset

    if dtype not in ("float32", "bfloat16"):
        raise SurgeError(f"--dtype {dtype!r} is not float32 or bfloat16")
    cfg = make_preset(
        preset,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        seed=seed,
        dtype=dtype,
        model_type=arch,
    )
    check_shape(cfg)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise SurgeError(f"{out_dir} is not empty; choose a new directory")
    check_fits_in_memory(cfg)
    try:  # a path that cannot be made is one line, before torch loads
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SurgeError(
            f"cannot create {out_dir} ({e.strerror}); choose a writable directory"
        ) from None
    from surge.model.tiny import create_tiny_model  # torch: only once the call is good

    create_tiny_model(out_dir, cfg)
    size_mb = (out_dir / "model.safetensors").stat().st_size / 1e6
    typer.echo(f"wrote {out_dir} ({size_mb:.1f} MB, {cfg.num_layers} layers)")


@app.command("import")
def import_(
    hf_dir: Annotated[
        Path, typer.Argument(help="Local HF checkpoint (safetensors) or a .gguf file.")
    ],
    store_dir: Annotated[Path, typer.Argument(help="Directory for the packed block store.")],
    blocks: Annotated[
        int | None,
        typer.Option(
            "--blocks", "-b", help="Number of blocks (1..layers; default min(layers, 8))."
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Model name (default: HF_DIR's name).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace STORE_DIR if it is not empty.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    dtype: Annotated[
        str, typer.Option(help="GGUF only: dequantize to float32 or bfloat16.")
    ] = "float32",
    equal_blocks: Annotated[
        bool,
        typer.Option(
            "--equal-blocks",
            help="Pad every block with zeros to the largest one's bytes, so each block moves "
            "as one equal block of the model `surge serve --emulate` emulates (needed on "
            "--cluster netns; docs/emulation.md). Costs disk: the end blocks hold the "
            "embeddings and the head.",
        ),
    ] = False,
) -> None:
    """Pack a HF Llama-family checkpoint or a GGUF file into blocks: manifest.json +
    block-NNNN.bin files."""
    from surge.model.import_checks import check_import, is_gguf

    check_import(hf_dir, store_dir, blocks, overwrite, dtype, equal_blocks)
    from surge.model.gguf import import_gguf  # torch: only once the call is good
    from surge.model.importer import import_checkpoint

    if is_gguf(hf_dir):
        m = import_gguf(hf_dir, store_dir, blocks, name, overwrite, not quiet, dtype, equal_blocks)
    else:
        m = import_checkpoint(
            hf_dir,
            store_dir,
            num_blocks=blocks,
            name=name,
            overwrite=overwrite,
            progress=not quiet,
            equal_blocks=equal_blocks,
        )
    equal = f" (equal: {m.blocks[0].size_bytes / 1e6:.2f} MB each)" if equal_blocks else ""
    typer.echo(
        f"imported {m.name}: {m.num_blocks} blocks{equal}, {m.total_bytes / 1e6:.1f} MB "
        f"-> {store_dir}"
    )


@app.command("inspect")
def inspect(
    store_dir: Annotated[Path, typer.Argument(help="A store made by `surge model import`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
    verify: Annotated[bool, typer.Option(help="Check every block's checksum.")] = False,
) -> None:
    """Show a store's blocks (layer ranges, sizes, checksums)."""
    from surge.model.manifest import read_manifest, verify_store

    m = read_manifest(store_dir)
    if verify:  # the same check `surge deploy` makes (a missing block is a damaged store)
        verify_store(m)
    if as_json:
        typer.echo(json.dumps(m.to_json(), indent=1))
        return
    a = m.arch
    typer.echo(
        f"{m.name}: {a.model_type}, {a.num_layers} layers, hidden {a.hidden_size}, "
        f"{a.num_heads}/{a.num_kv_heads} heads, vocab {a.vocab_size}, {a.dtype}"
    )
    for b in m.blocks:
        extra = "+embed" if b.has_embed else ""
        extra += "+head" if b.has_head else ""
        typer.echo(
            f"  block {b.index}: layers {b.first_layer}-{b.end_layer - 1}{extra}, "
            f"{b.size_bytes / 1e6:.2f} MB, {b.checksum}"
        )
    if verify:
        typer.echo("all checksums ok")
