"""`BatchMeta`: which sequences one engine step runs and where each stands.

Made by the scheduler at the head of a pipeline, it travels with the hidden states to every
stage, whose KV cache turns it into attention plumbing. Plain data, serializable as JSON.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchMeta:
    """Which sequences a step runs and where each stands; travels with the hidden states."""

    seq_ids: tuple[int, ...]
    ctx_lens: tuple[int, ...]
    """Tokens of each sequence already in the KV cache before this step."""
    q_lens: tuple[int, ...]
    """New tokens of each sequence in this step (prompt length at prefill, 1 at decode)."""
    block_hashes: tuple[tuple[int, ...], ...] = ()
    """Prefix caching (empty: off): per sequence, the chained hashes of the KV blocks this step
    fills, i.e. blocks ctx_len // page_size .. (ctx_len + q_len) // page_size - 1, so every
    stage's cache can name them for reuse (`surge.engine.page_pool`)."""

    def __post_init__(self) -> None:
        if not (len(self.seq_ids) == len(self.ctx_lens) == len(self.q_lens)):
            raise ValueError("BatchMeta fields must have the same length")
        if len(set(self.seq_ids)) != len(self.seq_ids):
            raise ValueError("BatchMeta has a sequence twice")
        if any(q < 1 for q in self.q_lens) or any(c < 0 for c in self.ctx_lens):
            raise ValueError("BatchMeta needs q_lens >= 1 and ctx_lens >= 0")
        if self.block_hashes and len(self.block_hashes) != len(self.seq_ids):
            raise ValueError("BatchMeta block_hashes needs one entry per sequence")

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def max_q_len(self) -> int:
        return max(self.q_lens)

    def to_json(self) -> dict[str, list]:
        d: dict[str, list] = {
            "seq_ids": list(self.seq_ids),
            "ctx_lens": list(self.ctx_lens),
            "q_lens": list(self.q_lens),
        }
        if self.block_hashes:  # absent when caching is off: old readers see the old frame
            d["block_hashes"] = [list(h) for h in self.block_hashes]
        return d

    @staticmethod
    def from_json(d: dict[str, list]) -> "BatchMeta":
        hashes = tuple(tuple(h) for h in d.get("block_hashes", ()))
        return BatchMeta(tuple(d["seq_ids"]), tuple(d["ctx_lens"]), tuple(d["q_lens"]), hashes)
