"""How long a sequence a model and its KV cache can hold, and the prompt check against it.

What flows: a `ModelArch` and an `EngineConfig` in; a token limit, or a `SurgeError` for a
prompt the model cannot take, out. Owned by engine/; used by the engine itself and, before
any weights load, by the controller (the API's 400s) and `surge generate`. Apart from
`llm_engine.py` so that those callers do not import torch (~1.5 s of CPU) to compare two
integers.
"""

from surge.config import EngineConfig
from surge.errors import SurgeError
from surge.model.arch import ModelArch


def context_limit(arch: ModelArch, config: EngineConfig) -> int:
    """Longest sequence (prompt + output) this model and KV cache can hold."""
    return min(arch.max_position_embeddings, config.max_kv_tokens)


def check_prompt(arch: ModelArch, config: EngineConfig, prompt_token_ids: list[int]) -> None:
    """Raise a `SurgeError` for a prompt the model cannot take (before any weights load)."""
    if not prompt_token_ids:
        raise SurgeError("the prompt is empty; give at least one token")
    bad = [t for t in prompt_token_ids if not 0 <= t < arch.vocab_size]
    if bad:
        raise SurgeError(f"token id {bad[0]} is outside the vocabulary (0..{arch.vocab_size - 1})")
    limit = context_limit(arch, config)
    if len(prompt_token_ids) >= limit:
        raise SurgeError(
            f"the prompt has {len(prompt_token_ids)} tokens but the model's context holds "
            f"{limit}; shorten the prompt to at most {limit - 1} tokens"
        )
