"""Tiny GGUF files for tests, written the way llama.cpp's convert_hf_to_gguf.py writes them.

From a HF checkpoint made in the test (random weights, surge's own byte-level tokenizer):
tensors renamed to GGUF's names, Llama's q/k rows permuted for llama.cpp's rope, matrices
quantized by the `gguf` package, and the tokenizer stored as a `gpt2` vocabulary + merges.
"""

import json
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants
from safetensors.torch import load_file

_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def gguf_name(hf: str) -> str:
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in fixed:
        return fixed[hf]
    _, _, layer, *rest = hf.split(".")
    part, kind = ".".join(rest[:-1]), rest[-1]
    return f"blk.{layer}.{_LAYER[part]}.{kind}"


SPM_PIECES = (
    "▁t", "he", "▁the", "▁a", "in", "▁in", "or", "ld", "▁w", "▁wor", "▁world", "ll", "llo",
    "▁H", "▁He", "▁Hello", "nn", "▁inn", "er", "▁two", "▁s", "pa", "ce", "es", "▁1",
)  # fmt: skip
"""Merged pieces of the test's SentencePiece vocabulary, best first."""


def spm_vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, types) of a Llama 2-style vocabulary: <unk> <s> </s>, the 256 byte
    tokens, single characters, then `SPM_PIECES`; padded to `size`."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3, *[6] * 256]
    chars = sorted(set("".join(SPM_PIECES)) | set("abcdefghijklmnopqrstuvwxyz"))
    tokens += chars + list(SPM_PIECES)
    types += [1] * (len(chars) + len(SPM_PIECES))
    scores = [0.0] * 259 + [-1000.0 - i for i in range(len(chars))]
    scores += [-float(i) for i in range(len(SPM_PIECES))]
    pad = size - len(tokens)
    return tokens + [f"[PAD{i}]" for i in range(pad)], scores + [-1e4] * pad, types + [1] * pad


def _write_spm_tokenizer(w: GGUFWriter, size: int) -> None:
    tokens, scores, types = spm_vocab(size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def _write_bpe_tokenizer(w: GGUFWriter, hf_dir: Path, cfg: dict) -> None:
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    for added in tok["added_tokens"]:
        tokens[added["id"]] = added["content"]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), cfg["vocab_size"])]
    specials = {a["id"] for a in tok["added_tokens"] if a["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in specials else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    eos = cfg["eos_token_id"]
    w.add_eos_token_id(eos if isinstance(eos, int) else eos[0])
    w.add_add_bos_token(True)


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_gguf(
    hf_dir: Path,
    out: Path,
    qtype: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    arch: str | None = None,
    chat_template: str | None = CHAT_TEMPLATE,
    odd_tensor: tuple[str, GGMLQuantizationType] | None = None,
    sentencepiece: bool = False,
) -> Path:
    """Write `hf_dir` as GGUF file `out`, matrices quantized as `qtype` (norms stay F32).
    `odd_tensor`: (tensor name, type) written raw, for files surge must refuse;
    `sentencepiece`: a Llama 2-style vocabulary (`spm_vocab`) instead of the checkpoint's."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = arch or cfg["model_type"]
    w = GGUFWriter(out, arch)
    heads, kv = (
        cfg["num_attention_heads"],
        cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
    )
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(
        cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 1e4))
    )
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_vocab_size(cfg["vocab_size"])

    if sentencepiece:
        _write_spm_tokenizer(w, cfg["vocab_size"])
    else:
        _write_bpe_tokenizer(w, hf_dir, cfg)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        tensors.update(load_file(f))
    for hf, t in tensors.items():
        x = t.float().numpy()
        if arch == "llama" and (".q_proj." in hf or ".k_proj." in hf):
            x = permute(x, heads if ".q_proj." in hf else kv)
        name = gguf_name(hf)
        if x.ndim == 2 and x.shape[1] % 32 == 0 and qtype != GGMLQuantizationType.F32:
            w.add_tensor(name, quants.quantize(x, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, x)
    if odd_tensor is not None:
        name, raw = odd_tensor
        if raw == GGMLQuantizationType.F32:
            w.add_tensor(name, np.zeros((4, 32), dtype=np.float32))
        else:
            w.add_tensor(name, np.zeros((4, 32), dtype=np.int8), raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
