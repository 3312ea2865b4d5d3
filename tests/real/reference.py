"""transformers' greedy continuation on the real model (its generation config: stops at EOS)."""

import torch

from tests.engine.reference import one_torch_thread


def hf_greedy_ids(hf_smollm2, ids: list[int], max_new_tokens: int) -> list[int]:
    model, _ = hf_smollm2
    with one_torch_thread():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.int64),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return out[0, len(ids) :].tolist()
