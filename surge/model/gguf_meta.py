"""A GGUF file's metadata read as the Hugging Face files surge imports from.

What flows: a `gguf.GGUFReader` (llama.cpp's own reader) in; out, the contents of
`config.json`, `generation_config.json`, `tokenizer.json` (built with `tokenizers` from the
vocabulary, merges and token types llama.cpp stores), `tokenizer_config.json` (special
tokens, BOS/EOS handling) and `chat_template.jinja`, and the map from GGUF tensor names to
HF ones. Anything surge cannot serve (architecture, tokenizer model, rope scaling) is one
`SurgeError` naming it. Owned by the model layer; used by `surge.model.gguf`.
"""

import logging
import re
from dataclasses import dataclass
from typing import Any

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from surge.errors import SurgeError

log = logging.getLogger(__name__)

GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}
"""GGUF `general.architecture` -> HF model_type surge serves."""

TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 3, 4
"""llama.cpp's token types that are added tokens (special, and plain added ones)."""

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2_SPLIT,),
    "gpt-2": (_GPT2_SPLIT,),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx"), (_LLAMA3_SPLIT,)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), (_QWEN2_SPLIT,)),
    # Digits one by one, then GPT-2's split: how these vocabularies were trained
    # (llama.cpp's llama-vocab.cpp, and SmolLM2's own tokenizer.json: Digits + ByteLevel).
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "codeshell", "command-r", "exaone", "minerva"),
        (r"\p{N}", _GPT2_SPLIT),
    ),
}
"""llama.cpp's `tokenizer.ggml.pre` -> the regexes it splits text with, applied in turn."""


@dataclass(frozen=True)
class GgufModel:
    """What a GGUF file says about its model, in Hugging Face's terms."""

    config: dict[str, Any]
    generation_config: dict[str, Any]
    tokenizer: Tokenizer
    tokenizer_config: dict[str, Any]
    chat_template: str | None
    permute_qk: bool
    """llama.cpp stores Llama's q/k rows interleaved for its rope (convert_hf_to_gguf's
    `permute`); the import undoes it. Qwen2 is stored as HF has it."""


def field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """The value of metadata `key` (a str, number, bool or list), or `default`."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _required(reader: GGUFReader, key: str) -> Any:
    value = field(reader, key)
    if value is None:
        raise SurgeError(f"the GGUF file lacks metadata {key}; is it a complete model file?")
    return value


def hf_tensor_name(gguf_name: str) -> str | None:
    """The HF name of GGUF tensor `gguf_name` (None: not a tensor surge knows)."""
    fixed = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    if gguf_name in fixed:
        return fixed[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    layer_parts = {
        "attn_norm": "input_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    if m is None or m.group(2) not in layer_parts:
        return None
    return f"model.layers.{m.group(1)}.{layer_parts[m.group(2)]}.{m.group(3)}"


def _rope(reader: GGUFReader, arch: str) -> dict[str, Any]:
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise SurgeError(
            "the GGUF file scales rope by a rope_freqs tensor (Llama 3.1-style), which surge "
            "does not import yet; import the Hugging Face checkpoint instead"
        )
    kind = field(reader, f"{arch}.rope.scaling.type", "none")
    if kind in ("none", None):
        return {}
    if kind != "linear":
        raise SurgeError(
            f"the GGUF file uses rope scaling {kind!r}; surge imports none or linear from GGUF"
        )
    return {
        "rope_scaling": {
            "rope_type": "linear",
            "factor": field(reader, f"{arch}.rope.scaling.factor", 1.0),
        }
    }


def read_config(reader: GGUFReader) -> tuple[str, dict[str, Any]]:
    """(GGUF architecture, HF config.json dict)."""
    arch = field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise SurgeError(
            f"GGUF architecture {arch!r} is not supported; surge imports "
            f"{', '.join(GGUF_ARCHITECTURES)} GGUF files"
        )
    heads = int(_required(reader, f"{arch}.attention.head_count"))
    hidden = int(_required(reader, f"{arch}.embedding_length"))
    tokens = _required(reader, "tokenizer.ggml.tokens")
    eos = field(reader, "tokenizer.ggml.eos_token_id")
    config = {
        "model_type": GGUF_ARCHITECTURES[arch],
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        "hidden_act": "silu",
        "vocab_size": int(field(reader, f"{arch}.vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(_required(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_required(reader, f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(field(reader, f"{arch}.attention.key_length", hidden // heads)),
        "max_position_embeddings": int(field(reader, f"{arch}.context_length", 2048)),
        "rms_norm_eps": float(field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        **_rope(reader, arch),
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
    }
    return arch, config


def _eos_ids(reader: GGUFReader) -> list[int]:
    """Every id that ends a turn: EOS, and llama.cpp's end-of-turn/-message ids if set."""
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    ids = [field(reader, f"tokenizer.ggml.{k}") for k in keys]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def _byte_level_tokenizer(reader: GGUFReader, tokens: list[str]) -> Tokenizer:
    """GPT-2-style byte-level BPE from the vocabulary and merges, split as llama.cpp does."""
    merges = field(reader, "tokenizer.ggml.merges")
    if merges is None:
        raise SurgeError("the GGUF file's BPE tokenizer has no merges; is the file complete?")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs, fuse_unk=False)
    tok = Tokenizer(bpe)
    pre = field(reader, "tokenizer.ggml.pre", "default")
    splits = PRE_TOKENIZER_SPLITS.get(pre)
    if splits is None:
        log.warning("GGUF pre-tokenizer %r is unknown to surge; splitting text as GPT-2 does", pre)
        splits = (_GPT2_SPLIT,)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges a SentencePiece vocabulary implies (a Llama 2 GGUF stores none): every split
    of a piece into two pieces of the vocabulary, best-scored piece first, as transformers
    derives them (`generate_merges`), so both tokenize alike."""
    ids = {t: i for i, t in enumerate(tokens)}
    merges: list[tuple[str, str, float]] = []
    for piece, score in zip(tokens, scores, strict=True):
        local = [
            (piece[:i], piece[i:], score)
            for i in range(1, len(piece))
            if piece[:i] in ids and piece[i:] in ids
        ]
        merges += sorted(local, key=lambda m: (ids[m[0]], ids[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _sentencepiece_tokenizer(reader: GGUFReader, tokens: list[str]) -> Tokenizer:
    """SentencePiece BPE (Llama 2, Mistral v0.1): byte fallback to the <0xNN> tokens, a "▁"
    before the text and for every space, as transformers' LlamaTokenizer builds it."""
    scores = [float(x) for x in _required(reader, "tokenizer.ggml.scores")]
    unk = field(reader, "tokenizer.ggml.unknown_token_id")
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=spm_merges(tokens, scores),
        unk_token=tokens[unk] if unk is not None else None,
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    return tok


def _add_special_tokens(tok: Tokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens (`<|im_end|>`) become special added tokens, matched whole and skipped
    by `skip_special_tokens`; user-defined ones (`<think>`) plain added tokens."""
    special = [t for t, k in zip(tokens, types, strict=False) if k == TOKEN_TYPE_CONTROL]
    plain = [t for t, k in zip(tokens, types, strict=False) if k == TOKEN_TYPE_USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in plain])


def _post_processor(
    bos: str | None, eos: str | None, add_bos: bool, add_eos: bool, ids: dict[str, int]
) -> processors.TemplateProcessing:
    """The tokenizer's own BOS/EOS on plain text (`add_special_tokens=True`); chat templates
    write theirs, so the chat path encodes without it (as transformers and vLLM do)."""
    head = [bos] if add_bos and bos else []
    tail = [eos] if add_eos and eos else []
    single = " ".join([*head, "$A", *tail])
    pair = " ".join([*head, "$A", *tail, *head, "$B:1", *tail])
    specials = [(t, ids[t]) for t in dict.fromkeys(head + tail)]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def read_tokenizer(reader: GGUFReader) -> tuple[Tokenizer, dict[str, Any], str | None]:
    """(tokenizer, tokenizer_config.json dict, chat template or None)."""
    model = field(reader, "tokenizer.ggml.model")
    tokens = list(_required(reader, "tokenizer.ggml.tokens"))
    builders = {"gpt2": _byte_level_tokenizer, "llama": _sentencepiece_tokenizer}
    if model not in builders:
        raise SurgeError(
            f"GGUF tokenizer model {model!r} is not supported; surge imports byte-level BPE "
            "(gpt2: Llama 3, Qwen2, SmolLM) and SentencePiece BPE (llama: Llama 2, Mistral) "
            "GGUF tokenizers; import the Hugging Face checkpoint instead"
        )
    tok = builders[model](reader, tokens)
    _add_special_tokens(tok, tokens, list(field(reader, "tokenizer.ggml.token_type", [])))

    def name(key: str) -> str | None:
        i = field(reader, f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos, eos = name("bos_token_id"), name("eos_token_id")
    # Older SentencePiece files lack the flag: llama.cpp (and transformers) add BOS there.
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", model == "llama"))
    add_eos = bool(field(reader, "tokenizer.ggml.add_eos_token", False))
    ids = {t: i for i, t in enumerate(tokens)}
    tok.post_processor = _post_processor(bos, eos, add_bos, add_eos, ids)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": name("unknown_token_id"),
        "pad_token": name("padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
    }
    template = field(reader, "tokenizer.chat_template")
    return tok, tokenizer_config, template if isinstance(template, str) else None


def read_gguf_model(reader: GGUFReader) -> GgufModel:
    """Everything but the weights, with a `SurgeError` for what surge cannot import."""
    arch, config = read_config(reader)
    tok, tokenizer_config, template = read_tokenizer(reader)
    eos = _eos_ids(reader)
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": eos}
    return GgufModel(
        config={**config, "eos_token_id": eos},
        generation_config=generation,
        tokenizer=tok,
        tokenizer_config=tokenizer_config,
        chat_template=template,
        permute_qk=arch == "llama",
    )
