"""A small byte-level BPE tokenizer made locally, for tiny test and demo models.

Nothing is downloaded: the tokenizer is trained on a fixed built-in text, so the same
vocabulary size always gives the same `tokenizer.json`. Byte-level means any text encodes
(unknown characters fall back to bytes). Also the one place that loads a store's
tokenizer for the CLI and engine.
"""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from surge.errors import SurgeError

BOS_TOKEN, EOS_TOKEN = "<s>", "</s>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN)
BOS_ID, EOS_ID = 0, 1
NUM_BYTE_TOKENS = 256
MIN_VOCAB = len(SPECIAL_TOKENS) + NUM_BYTE_TOKENS

_CORPUS = """\
When traffic for a model surges, scale it out across machines in under a second and serve
requests while the model is still arriving; when traffic stops, give the hardware back.
The quick brown fox jumps over the lazy dog. A model is cut into blocks that travel one by
one, and an engine runs any contiguous range of layers it holds. Nodes forward blocks as
soon as they arrive, along a binomial pipeline, so that every node holds the whole model
after a number of steps close to the number of blocks plus the logarithm of the number of
nodes. Hello world! Once upon a time there was a little language model that wanted to
answer every question quickly. It learned to read, to write, to count: one, two, three,
four, five, six, seven, eight, nine, ten. def main(): print("hello, world") return 0
"""


def check_vocab_size(vocab_size: int) -> None:
    """Raise `SurgeError` unless a tokenizer of `vocab_size` tokens can be built."""
    if vocab_size < MIN_VOCAB:
        raise SurgeError(f"--vocab {vocab_size} is too small: the tokenizer needs >= {MIN_VOCAB}")


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer with at most `vocab_size` tokens (ids 0/1 are <s>/</s>)."""
    check_vocab_size(vocab_size)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the lines so merges have counts; the corpus is fixed, so training is too.
    tok.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)
    assert tok.token_to_id(BOS_TOKEN) == BOS_ID and tok.token_to_id(EOS_TOKEN) == EOS_ID
    return tok


def load_tokenizer(path: Path) -> Tokenizer:
    """Load a `tokenizer.json`, with a clear error if it is unreadable."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad files
        raise SurgeError(f"cannot read tokenizer {path}: {e}") from None
