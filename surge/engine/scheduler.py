"""Continuous batching: which sequences run in the next step (nano-vllm style).

Sequences join and leave the running batch every step. A step is either a prefill (new or
recomputed sequences, their uncached token span) or a decode (one token for every running
sequence); keeping them apart avoids padding short decode rows to prompt length. Chunked
prefill (Sarathi-Serve, Agrawal et al. OSDI '24, §4): a prompt longer than
`prefill_chunk_tokens` is prefilled piece by piece, and the running sequences decode one token
between pieces, so a long prompt delays a decode by one piece, not by the whole prompt. (The
pieces are not mixed into the decode batch: the step layout is padded [B, Q], so a decode row
in a prefill batch would cost a whole piece of padding.)

Prefix caching: a new sequence's full-block hashes (`page_pool.block_hashes`) go to the
executor's `claim_prefix`, which maps the cached blocks into the sequence's page table and
says how many tokens they cover; prefill starts after them. The scheduler keeps its own KV
page accounting with the same arithmetic as the cache (`pages_needed`), so it can plan for
caches it does not own (every stage of a pipeline has the same page budget); it counts a
shared page once per sequence, which can only over-count, never overflow the cache. When a
decode would overflow, the most recently admitted sequence is preempted: its cache is dropped
and it is recomputed later by prefill over prompt + output (from its cached blocks, if any).

`take_waiting` takes sequences that never started back out of the queue, also while a step
runs in another thread (its `schedule` and the take hold one lock): a BlitzScale live target
redirects a source's queued requests (§4 step 1) without waiting for the source's step.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.page_pool import block_hashes, pages_needed
from surge.engine.sampling import Draw, SamplingParams
from surge.policy.kv_admission import admits, decode_preemptions


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
    draw: Draw | None = None
    """What picks its tokens (`SamplingParams.draw`: a sampled one's seed drawn once, here,
    when the request names none); set at creation."""
    num_prefix_hit_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache at its (last) admission."""
    _hashes: list[int] = field(default_factory=list)

    def block_hashes(self, num_blocks: int, page_size: int) -> list[int]:
        """Chained hashes of the first `num_blocks` full blocks (computed once, extended)."""
        if len(self._hashes) < num_blocks:
            block_hashes(self.all_token_ids[: num_blocks * page_size], page_size, self._hashes)
        return self._hashes[:num_blocks]

    def __post_init__(self) -> None:
        if self.draw is None:
            self.draw = self.params.draw()

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_span(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without copying the whole sequence (a
        decode step's one token would otherwise copy the prompt each step)."""
        prompt, n = self.prompt_token_ids, len(self.prompt_token_ids)
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        if end <= n:
            return prompt[start:end]
        return prompt[start:] + self.output_token_ids[: end - n]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@dataclass(frozen=True)
class ScheduledStep:
    """What the next engine step runs."""

    is_prefill: bool
    seqs: list[Sequence]
    batch: BatchMeta
    token_ids: np.ndarray
    """[B, Q] int64 token ids to feed (padded with 0); numpy, not torch, so a scheduler
    runs where torch is not imported (a pipeline's head engines, `runtime/pipeline_heads.py`;
    a local executor takes it as a tensor without a copy)."""
    preempted: list[Sequence]
    """Sequences whose KV cache must be dropped before this step."""
    samples: tuple[bool, ...]
    """Per sequence: this step reaches its last token, so a token is sampled (False for a
    prompt piece of a chunked prefill)."""


class Scheduler:
    """Admits waiting sequences and batches running ones, within the KV page budget."""

    def __init__(
        self, config: EngineConfig, claim_prefix: Callable[[int, list[int]], int] | None = None
    ) -> None:
        self.config = config
        self.claim_prefix = claim_prefix if config.enable_prefix_caching else None
        """Maps a new sequence's cached prefix blocks in the executor's caches (None: off)."""
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._queue_lock = threading.Lock()
        """Held by `schedule` and `take_waiting`: the queue is read by the step's thread."""
        self._pages: dict[int, int] = {}
        self._free_pages = config.num_pages
        self._last_left_partial = False
        self.prefix_query_tokens = 0
        """Prompt tokens looked up in the prefix cache (vLLM's `prefix_cache_queries`)."""
        self.prefix_hit_tokens = 0
        """Of those, tokens found cached (vLLM's `prefix_cache_hits`)."""

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

    def _need_pages(self, seq: Sequence, num_tokens: int) -> int:
        """Pages `seq` needs beyond those it holds to hold `num_tokens` tokens."""
        have = self._pages.get(seq.seq_id, 0)
        return pages_needed(num_tokens, self.config.page_size_tokens) - have

    def _reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Take the pages for `num_tokens` of `seq`: a waiting sequence is admitted by the
        tokens it has now, its output's pages come step by step (`policy.kv_admission`)."""
        have = self._pages.get(seq.seq_id, 0)
        need = self._need_pages(seq, num_tokens)
        if not admits(need, self._free_pages):
            return False
        self._free_pages -= need
        self._pages[seq.seq_id] = have + need
        return True

    @property
    def held_pages(self) -> int:
        """KV pages its sequences hold now."""
        return sum(self._pages.values())

    def set_budget_pages(self, num_pages: int) -> None:
        """Let its sequences hold `num_pages` KV pages in all from now on (a pipeline head
        re-splitting its stages' cache among micro-batch groups, `runtime/endpoints.py`);
        never less than they hold. Between steps only. `config.num_pages` stays the
        longest sequence it admits."""
        if num_pages < self.held_pages:
            raise ValueError(f"a budget of {num_pages} pages is below the {self.held_pages} held")
        self._free_pages = num_pages - self.held_pages

    def release(self, seq: Sequence) -> None:
        """Return a sequence's pages to the budget (finished or preempted)."""
        self._free_pages += self._pages.pop(seq.seq_id, 0)

    @staticmethod
    def _unstarted(seq: Sequence) -> bool:
        return not seq.output_token_ids and seq.num_cached == 0

    def unstarted(self) -> list[int]:
        """Ids of the queued sequences that never started, in queue order (safe while a
        step runs in another thread)."""
        with self._queue_lock:
            return [s.seq_id for s in self.waiting if self._unstarted(s)]

    def take_waiting(self, seq_ids: set[int]) -> list[Sequence]:
        """Take the sequences of `seq_ids` that wait and never started (no token generated,
        nothing cached: not a preempted or resumed one) out of the queue, in queue order.
        Safe while a step runs in another thread: that step's `schedule` took what it runs
        already, or takes it after this."""
        with self._queue_lock:
            taken = [s for s in self.waiting if s.seq_id in seq_ids and self._unstarted(s)]
            for s in taken:
                self.waiting.remove(s)
        return taken

    def schedule(self) -> ScheduledStep | None:
        """Pick the next step, or None when there is nothing to run."""
        with self._queue_lock:
            return self._schedule()

    def _schedule(self) -> ScheduledStep | None:
        partial = [s for s in self.running if s.num_tokens - s.num_cached > 1]
        decodable = [s for s in self.running if s.num_tokens - s.num_cached == 1]
        # After a prompt piece, the running sequences decode before the next piece.
        if not (self._last_left_partial and decodable):
            step = self._prefill(partial, bool(decodable))
            if step is not None:
                return step
        return self._decode(decodable) or self._prefill(partial, False)

    def _admit(self, seq: Sequence) -> None:
        """Start a waiting sequence: its pages are reserved; take its cached prefix."""
        self.waiting.popleft()
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        seq.num_prefix_hit_tokens = 0
        if self.claim_prefix is None:
            return
        page = self.config.page_size_tokens
        # At least the last token is computed: its logits give the next token.
        hashes = seq.block_hashes((seq.num_tokens - 1) // page, page)
        hit = self.claim_prefix(seq.seq_id, hashes) if hashes else 0
        seq.num_cached = seq.num_prefix_hit_tokens = hit
        self.prefix_query_tokens += seq.num_tokens
        self.prefix_hit_tokens += hit

    def _prefill(self, partial: list[Sequence], decoding: bool) -> ScheduledStep | None:
        """Prefill pieces; `decoding`: sequences wait to decode between them. Pieces are
        `prefill_chunk_tokens` only then (Sarathi-Serve §4 bounds the stall of running
        decodes); with none decoding there is no stall to bound, and a piece is the whole
        `max_prefill_tokens` budget: 4x fewer steps for a 2,000-token prompt, each with far
        fewer ops per token (SmolLM2, 2,000 tokens, torch's 2 threads on the loaded 2-core
        VM: pieces of 512 took 26-28 CPU-s against 12 whole, transformers 15)."""
        chunk = self.config.prefill_chunk_tokens
        budget = self.config.max_prefill_tokens
        if chunk and not decoding:
            chunk = max(chunk, budget)
        seqs: list[Sequence] = []
        q_lens: list[int] = []
        for seq in partial:  # prompts already under way go first (they hold their pages)
            if budget <= 0:
                break
            q = min(seq.num_tokens - seq.num_cached, chunk or budget, budget)
            seqs.append(seq)
            q_lens.append(q)
            budget -= q
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if not chunk and seqs and seq.num_tokens - seq.num_cached > budget:
                break  # unchunked: a prompt runs whole (alone if it exceeds the budget)
            if not self._reserve(seq, seq.num_tokens):
                break
            self._admit(seq)
            q = seq.num_tokens - seq.num_cached
            q = min(q, chunk, budget) if chunk else q
            seqs.append(seq)
            q_lens.append(q)
            budget -= q
        if not seqs:
            return None
        step = self._step(True, seqs, q_lens, [])
        self._last_left_partial = not all(step.samples)
        return step

    def _decode(self, decode: list[Sequence]) -> ScheduledStep | None:
        # After the step the cache holds every token of the sequence; where the pages run
        # out the most recently admitted sequences are preempted (`decode_preemptions`).
        needs = [self._need_pages(seq, seq.num_tokens) for seq in decode]
        held = [self._pages.get(seq.seq_id, 0) for seq in decode]
        keep = len(decode) - decode_preemptions(needs, held, self._free_pages)
        preempted = decode[keep:][::-1]  # the latest first: the earliest ends up first
        for victim in preempted:
            self._preempt(victim)
        decode = decode[:keep]
        for seq in decode:
            if not self._reserve(seq, seq.num_tokens):
                raise RuntimeError(f"sequence {seq.seq_id} lost its pages after preemption")
        if not decode:
            return None
        self._last_left_partial = False
        return self._step(False, decode, [1] * len(decode), preempted)

    def _preempt(self, seq: Sequence) -> None:
        self.release(seq)
        self.running.remove(seq)
        seq.status = SeqStatus.WAITING
        seq.num_cached = 0
        self.waiting.appendleft(seq)

    def _step(
        self,
        is_prefill: bool,
        seqs: list[Sequence],
        q_lens: list[int],
        preempted: list[Sequence],
    ) -> ScheduledStep:
        # Padded in Python and converted once: a tensor op per sequence cost ~10 us each,
        # 0.3 ms a step at batch 32.
        width = max(q_lens)
        spans = [
            seq.token_span(seq.num_cached, seq.num_cached + q)
            for seq, q in zip(seqs, q_lens, strict=True)
        ]
        padded = [span + [0] * (width - len(span)) for span in spans]
        token_ids = np.array(padded, dtype=np.int64)
        hashes: tuple[tuple[int, ...], ...] = ()
        if self.config.enable_prefix_caching:
            page = self.config.page_size_tokens
            per_seq = []
            for seq, q in zip(seqs, q_lens, strict=True):
                first, end = seq.num_cached // page, (seq.num_cached + q) // page
                per_seq.append(tuple(seq.block_hashes(end, page)[first:]) if end > first else ())
            if any(per_seq):
                hashes = tuple(per_seq)
        batch = BatchMeta(
            seq_ids=tuple(s.seq_id for s in seqs),
            ctx_lens=tuple(s.num_cached for s in seqs),
            q_lens=tuple(q_lens),
            block_hashes=hashes,
        )
        samples = tuple(s.num_cached + q == s.num_tokens for s, q in zip(seqs, q_lens, strict=True))
        return ScheduledStep(is_prefill, seqs, batch, token_ids, preempted, samples)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self.running.remove(seq)
        self.release(seq)
