"""Continuous batching: which sequences run in the next step (nano-vllm style).

Sequences join and leave the running batch every step. A step is either a prefill (new or
recomputed sequences, their whole uncached token span) or a decode (one token for every
running sequence); keeping them apart avoids padding short decode rows to prompt length.
The scheduler keeps its own KV page accounting with the same arithmetic as the cache
(`pages_needed`), so it can plan for caches it does not own (every stage of a pipeline has
the same page budget). When a decode would overflow, the most recently admitted sequence is
preempted: its cache is dropped and it is recomputed later by prefill over prompt + output.
"""

import enum
from collections import deque
from dataclasses import dataclass, field

import torch

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.kv_cache import pages_needed
from surge.engine.sampling import SamplingParams, make_generator


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """One request's tokens and progress."""

    seq_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    num_cached: int = 0
    """Tokens whose keys and values are in the KV cache."""
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: str | None = None
    """`stop` (EOS or a stop token) or `length` (max_tokens or the context end)."""
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if not self.params.greedy and self.generator is None:
            self.generator = make_generator(self.params.seed)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@dataclass(frozen=True)
class ScheduledStep:
    """What the next engine step runs."""

    is_prefill: bool
    seqs: list[Sequence]
    batch: BatchMeta
    token_ids: torch.Tensor
    """[B, Q] token ids to feed (padded with 0)."""
    preempted: list[Sequence]
    """Sequences whose KV cache must be dropped before this step."""


class Scheduler:
    """Admits waiting sequences and batches running ones, within the KV page budget."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._pages: dict[int, int] = {}
        self._free_pages = config.num_pages

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (it must fit the KV cache on its own)."""
        if pages_needed(seq.num_tokens + 1, self.config.page_size_tokens) > self.config.num_pages:
            raise ValueError(
                f"sequence of {seq.num_tokens} tokens cannot fit the KV cache "
                f"({self.config.max_kv_tokens} tokens)"
            )
        self.waiting.append(seq)

    def adopt(self, seq: Sequence) -> bool:
        """Put a sequence whose cache is already filled straight into the running batch."""
        if len(self.running) >= self.config.max_num_seqs or not self._reserve(seq, seq.num_tokens):
            return False
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        return True

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _reserve(self, seq: Sequence, num_tokens: int) -> bool:
        have = self._pages.get(seq.seq_id, 0)
        need = pages_needed(num_tokens, self.config.page_size_tokens) - have
        if need > self._free_pages:
            return False
        self._free_pages -= need
        self._pages[seq.seq_id] = have + need
        return True

    def release(self, seq: Sequence) -> None:
        """Return a sequence's pages to the budget (finished or preempted)."""
        self._free_pages += self._pages.pop(seq.seq_id, 0)

    def schedule(self) -> ScheduledStep | None:
        """Pick the next step, or None when there is nothing to run."""
        prefill: list[Sequence] = []
        num_tokens = 0
        while self.waiting and len(self.running) + len(prefill) < self.config.max_num_seqs:
            seq = self.waiting[0]
            q = seq.num_tokens - seq.num_cached
            if prefill and num_tokens + q > self.config.max_prefill_tokens:
                break
            if not self._reserve(seq, seq.num_tokens):
                break
            self.waiting.popleft()
            prefill.append(seq)
            num_tokens += q
        if prefill:
            for seq in prefill:
                seq.status = SeqStatus.RUNNING
            self.running.extend(prefill)
            return self._step(True, prefill, [])

        preempted: list[Sequence] = []
        decode = list(self.running)
        i = 0
        while i < len(decode):
            seq = decode[i]
            # After the step the cache holds every token of the sequence.
            if self._reserve(seq, seq.num_tokens):
                i += 1
                continue
            victim = decode.pop()  # most recently admitted
            self._preempt(victim)
            preempted.append(victim)
        if not decode:
            return None
        return self._step(False, decode, preempted)

    def _preempt(self, seq: Sequence) -> None:
        self.release(seq)
        self.running.remove(seq)
        seq.status = SeqStatus.WAITING
        seq.num_cached = 0
        self.waiting.appendleft(seq)

    def _step(
        self, is_prefill: bool, seqs: list[Sequence], preempted: list[Sequence]
    ) -> ScheduledStep:
        spans = [seq.all_token_ids[seq.num_cached :] for seq in seqs]
        q_max = max(len(s) for s in spans)
        token_ids = torch.zeros(len(seqs), q_max, dtype=torch.int64)
        for b, span in enumerate(spans):
            token_ids[b, : len(span)] = torch.tensor(span, dtype=torch.int64)
        batch = BatchMeta(
            seq_ids=tuple(s.seq_id for s in seqs),
            ctx_lens=tuple(s.num_cached for s in seqs),
            q_lens=tuple(len(s) for s in spans),
        )
        return ScheduledStep(is_prefill, seqs, batch, token_ids, preempted)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self.running.remove(seq)
        self.release(seq)
