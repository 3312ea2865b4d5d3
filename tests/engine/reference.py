"""The Hugging Face reference for token-exactness tests, and the near-tie rule.

A differing token is accepted only where the reference's top two logits at that step are
within `NEAR_TIE` of each other; comparison stops there (the sequences have diverged) and the
test says so with a warning. Anything else is a failure.
"""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

NEAR_TIE = 1e-4

_models: dict[Path, object] = {}
_greedy: dict[tuple[Path, tuple[int, ...], int], tuple[list[int], list[torch.Tensor]]] = {}
"""References already computed this session (several tests and requests share a prompt)."""


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """This process's torch at one thread for a reference run, then as it was: on a loaded
    2-core host every op of a 2-thread run waits a scheduling slice for its second thread
    (measured at load 9: 60 tokens of the tiny model 0.63 s at 1 thread, over 240 s at 2).
    A thread count changes only the order of float32 sums: a token it could flip is a
    near-tie, which `assert_same_tokens` accepts."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def hf_greedy(
    hf_dir: Path, prompt: list[int], max_new_tokens: int, gguf_file: str | None = None
) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and per-step logits from transformers (float32, EOS ignored); with
    `gguf_file`, transformers reads that GGUF file in `hf_dir` itself."""
    key = hf_dir / gguf_file if gguf_file else hf_dir
    memo = (key, tuple(prompt), max_new_tokens)
    if memo not in _greedy:
        with one_torch_thread():
            _greedy[memo] = _generate(key, hf_dir, prompt, max_new_tokens, gguf_file)
    tokens, logits = _greedy[memo]
    return list(tokens), list(logits)


def _generate(
    key: Path, hf_dir: Path, prompt: list[int], max_new_tokens: int, gguf_file: str | None
) -> tuple[list[int], list[torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    if key not in _models:
        kw = {"gguf_file": gguf_file} if gguf_file else {}
        _models[key] = AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=torch.float32, **kw
        ).eval()
    model = _models[key]
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    tokens = out.sequences[0, len(prompt) :].tolist()
    return tokens, [step[0] for step in out.logits]


def assert_same_tokens(
    ours: list[int], ref: list[int], ref_logits: list[torch.Tensor], what: str
) -> None:
    """Token-for-token equality, except at a checked near-tie of the reference."""
    assert len(ours) == len(ref), f"{what}: {len(ours)} tokens vs reference {len(ref)}"
    for step, (a, b) in enumerate(zip(ours, ref, strict=True)):
        if a == b:
            continue
        top2 = torch.topk(ref_logits[step].float(), 2)
        gap = float(top2.values[0] - top2.values[1])
        assert gap < NEAR_TIE and a in top2.indices.tolist(), (
            f"{what}: token {step} is {a}, reference {b}; reference top-2 gap {gap:.2e} is not a "
            f"near-tie (< {NEAR_TIE})"
        )
        warnings.warn(
            f"{what}: tokens differ from step {step} at a reference near-tie (gap {gap:.2e}); "
            f"compared {step} tokens",
            stacklevel=2,
        )
        return
