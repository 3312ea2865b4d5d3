"""`surge generate`: run a prompt through a store on one local engine and print the result."""

import json
from pathlib import Path
from typing import Annotated

import typer

from surge.errors import SurgeError


def _parse_token_ids(text: str) -> list[int]:
    items = text.replace(" ", "").split(",")
    if text.strip() and "" in items:
        raise SurgeError(
            f"--prompt-token-ids has an empty item at position {items.index('') + 1}; "
            f"give comma-separated integers with none missing, e.g. 1,2,3"
        )
    try:
        ids = [int(t) for t in items if t]
    except ValueError:
        raise SurgeError(
            f"--prompt-token-ids {text!r} is not a comma-separated list of integers, e.g. 1,2,3"
        ) from None
    if not ids:
        raise SurgeError("--prompt-token-ids is empty; give at least one id, e.g. 1,2,3")
    return ids


def generate(
    store_dir: Annotated[
        Path | None,
        typer.Argument(
            help="Block store (default: SmolLM2 if setup imported it, else a tiny random model)."
        ),
    ] = None,
    prompt: Annotated[str | None, typer.Option(help="Prompt text.")] = None,
    prompt_token_ids: Annotated[
        str | None, typer.Option(help="Prompt as token ids, e.g. 1,2,3.")
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = 32,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling threshold.")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Keep the k most likely tokens (0 = all).")] = 0,
    seed: Annotated[int | None, typer.Option(help="Seed for sampling.")] = None,
    ignore_eos: Annotated[bool, typer.Option(help="Do not stop at end-of-sequence.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (token ids and text).")
    ] = False,
) -> None:
    """Generate text from a model store on this machine (CUDA if present, else CPU)."""
    if (prompt is None) == (prompt_token_ids is None):
        raise SurgeError("give exactly one of --prompt TEXT or --prompt-token-ids 1,2,3")
    # torch-free imports first: a bad flag, store or prompt is refused in well under a second,
    # before torch (~3 s to import) loads with the engine below.
    from surge.config import EngineConfig
    from surge.engine.sampling import SamplingParams
    from surge.model.manifest import read_manifest
    from surge.model.tokenizer import load_tokenizer

    # Sampling settings first: a bad one fails before anything is read or made (the
    # default tiny model included).
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        ignore_eos=ignore_eos,
    ).validate()
    if store_dir is None:
        from surge.model.default_store import default_model

        store_dir = default_model()[0]
    manifest = read_manifest(store_dir)
    tokenizer = (
        load_tokenizer(manifest.root / manifest.tokenizer_file)
        if manifest.tokenizer_file and manifest.root
        else None
    )
    if prompt is not None:
        if tokenizer is None:
            raise SurgeError("this store has no tokenizer; give --prompt-token-ids instead")
        ids = tokenizer.encode(prompt).ids
    else:
        ids = _parse_token_ids(prompt_token_ids or "")
    from surge.engine.llm_engine import LLMEngine
    from surge.engine.prompt_limits import check_prompt, context_limit

    config = EngineConfig()
    check_prompt(manifest.arch, config, ids)
    limit = context_limit(manifest.arch, config)
    if len(ids) + max_tokens > limit:
        raise SurgeError(
            f"--max-tokens {max_tokens} with a prompt of {len(ids)} tokens exceeds the "
            f"model's context of {limit}; use --max-tokens {limit - len(ids)} or fewer"
        )
    engine = LLMEngine(manifest, config)
    (out,) = engine.generate([ids], params)
    text = tokenizer.decode(out.token_ids) if tokenizer is not None else None
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "prompt_token_ids": ids,
                    "token_ids": out.token_ids,
                    "text": text,
                    "finish_reason": out.finish_reason,
                }
            )
        )
    else:
        typer.echo(text if text is not None else " ".join(map(str, out.token_ids)))
