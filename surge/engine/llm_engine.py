"""`LLMEngine`: scheduler -> executor -> sampler, step by step.

Requests come in as token ids with `SamplingParams`; each `step()` runs one scheduled batch
and returns the tokens it produced. `generate()` is the batch convenience on top. The
executor runs the model: `LocalExecutor` is one runner holding every layer (a full local
instance); a pipeline of stages in other processes is another executor with the same two
calls, so scheduling and sampling are the same code whatever runs the layers.

The executor also picks the tokens (`engine/sampling.py` `sample`, where the logits are: a
local runner, a pipeline's last stage), from each sequence's `Draw`. This module imports no
torch: a pipeline's head engines run in the controller, which never imports it; token ids go
to the executor as a numpy array and token ids come back.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.prompt_limits import check_prompt, context_limit
from surge.engine.sampling import Draw, Sampled, SamplingParams, TokenLogprobs, sample
from surge.engine.scheduler import Scheduler, Sequence
from surge.errors import SurgeError
from surge.model.manifest import Manifest, read_manifest

if TYPE_CHECKING:
    from surge.engine.runner import ModelRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    """One generated token of one request."""

    seq_id: int
    token_id: int
    finished: bool
    finish_reason: str | None
    logprobs: TokenLogprobs | None = None
    """Only when the request asked (`SamplingParams.logprobs`)."""
    num_cached_tokens: int | None = None
    """On the token a prefill produced: how many of the tokens it had to process came from
    the prefix cache instead (None on decode tokens)."""


@dataclass(frozen=True)
class Completion:
    """A finished request."""

    seq_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str


class Executor(Protocol):
    """Runs the whole model for one step, wherever its layers live, and picks the tokens."""

    def step(
        self, token_ids: np.ndarray, batch: BatchMeta, draws: tuple[Draw | None, ...]
    ) -> Sampled:
        """Token ids [B, Q] (int64) -> the next token of each row with a draw, in row
        order, and the logprobs it asks for (`engine/sampling.py` `sample` over the logits
        at each row's last token, where they are)."""
        ...

    def free(self, seq_ids: list[int]) -> None:
        """Drop these sequences' KV caches."""
        ...


class PrefixCachingExecutor(Executor, Protocol):
    """An executor whose caches can reuse cached prefix blocks (optional: without
    `claim_prefix`, every prompt is computed in full)."""

    def claim_prefix(self, seq_id: int, block_hashes: list[int]) -> int:
        """Map the longest cached prefix of a new sequence's chained block hashes into its
        caches; the number of tokens it covers."""
        ...


class LocalExecutor:
    """One runner holding every layer of the model, in this process."""

    def __init__(self, runner: ModelRunner) -> None:
        import torch  # imported already: the runner's

        if not (runner.first_layer == 0 and runner.end_layer == runner.arch.num_layers):
            raise ValueError("a local executor needs a runner over every layer")
        self.runner = runner
        self._tensor = torch.from_numpy

    @staticmethod
    def from_store(manifest: Manifest, config: EngineConfig) -> LocalExecutor:
        """A runner with every block read from the store on disk."""
        from surge.engine.runner import ModelRunner

        runner = ModelRunner(manifest, config)
        runner.load_blocks()
        return LocalExecutor(runner)

    def step(
        self, token_ids: np.ndarray, batch: BatchMeta, draws: tuple[Draw | None, ...]
    ) -> Sampled:
        return sample(self.runner.forward(self._tensor(token_ids), batch), draws, batch)

    def free(self, seq_ids: list[int]) -> None:
        for sid in seq_ids:
            self.runner.free(sid)

    def claim_prefix(self, seq_id: int, block_hashes: list[int]) -> int:
        return self.runner.kv.claim_prefix(seq_id, block_hashes)


class LLMEngine:
    """Serves a model with continuous batching (a full local instance by default)."""

    def __init__(
        self,
        manifest: Manifest,
        config: EngineConfig = EngineConfig(),
        executor: Executor | None = None,
        first_seq_id: int = 0,
    ) -> None:
        self.manifest = manifest
        self.arch = manifest.arch
        self.config = config.validate()
        self.executor = (
            executor if executor is not None else LocalExecutor.from_store(manifest, config)
        )
        self.scheduler = Scheduler(config, getattr(self.executor, "claim_prefix", None))
        self._ids = itertools.count(first_seq_id)  # engines sharing caches use disjoint ids
        self.seqs: dict[int, Sequence] = {}
        self.last_batch: BatchMeta | None = None
        """The batch the last `step()` ran (None: it had nothing to run): its shape, for
        whoever accounts for steps (GPU-time emulation paces a step by it)."""

    @staticmethod
    def from_store(store_dir: Path, config: EngineConfig = EngineConfig()) -> LLMEngine:
        return LLMEngine(read_manifest(store_dir), config)

    def check_prompt(self, prompt_token_ids: list[int]) -> None:
        """Raise a `SurgeError` for a prompt this engine cannot take."""
        check_prompt(self.arch, self.config, prompt_token_ids)

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        output_token_ids: list[int] | None = None,
    ) -> int:
        """Queue a request; returns its sequence id.

        `output_token_ids` continues a request that already generated tokens elsewhere (a
        mode switch or a re-run after a failure): its KV cache is rebuilt by one prefill over
        prompt + output (λScale §4.4) and generation goes on from there.
        """
        self.check_prompt(prompt_token_ids)
        seq = Sequence(next(self._ids), list(prompt_token_ids), params.validate())
        seq.output_token_ids = list(output_token_ids or [])
        self.scheduler.add(seq)
        self.seqs[seq.seq_id] = seq
        return seq.seq_id

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def adopt(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        output_token_ids: list[int],
        num_cached: int,
    ) -> int:
        """Take over a running sequence whose KV cache (all layers, `num_cached` tokens) the
        caller writes into this engine's runner under the returned id (KV migration,
        ParaServe §6); decoding goes on from its last token without recomputation."""
        seq = Sequence(next(self._ids), list(prompt_token_ids), params.validate())
        seq.output_token_ids = list(output_token_ids)
        if not output_token_ids or num_cached != seq.num_tokens - 1:
            raise ValueError("an adopted sequence must have every token but its last cached")
        seq.num_cached = num_cached
        if not self.scheduler.adopt(seq):
            raise SurgeError("no KV-cache room to adopt this sequence here")
        self.seqs[seq.seq_id] = seq
        return seq.seq_id

    def hand_over(self, seq_id: int) -> Sequence:
        """Take a decoding sequence out, its KV cache left where it is (an executor shared
        with the engine that `take_over`s it: a FlexPipe merge, `policy.flexpipe.merge`);
        its pages go back to this engine's budget."""
        seq = self.seqs.pop(seq_id)
        self.scheduler.running.remove(seq)
        self.scheduler.release(seq)
        return seq

    def take_over(self, seq: Sequence) -> bool:
        """Decode on, under its own id, a sequence another engine over the same KV cache
        handed over (`hand_over`); False (nothing changed): no batch or page room."""
        if seq.num_tokens - seq.num_cached != 1:
            raise ValueError("a sequence taken over must have every token but its last cached")
        if not self.scheduler.adopt(seq):
            return False
        self.seqs[seq.seq_id] = seq
        return True

    def release(self, seq_id: int) -> Sequence | None:
        """Forget a finished sequence (the engine keeps one until its owner has read it);
        None if it is already gone."""
        return self.seqs.pop(seq_id, None)

    def abort(self, seq_id: int) -> Sequence:
        """Take an unfinished sequence out (to continue it elsewhere); frees its cache."""
        seq = self.seqs.pop(seq_id)
        if seq in self.scheduler.waiting:
            self.scheduler.waiting.remove(seq)
        elif seq in self.scheduler.running:
            self.scheduler.running.remove(seq)
            self.scheduler.release(seq)
            self.executor.free([seq_id])
        return seq

    def unstarted(self) -> list[int]:
        """Ids of the queued sequences that never started, in the order they would (safe
        from another thread while a step runs)."""
        return self.scheduler.unstarted()

    def take_waiting(self, seq_ids: list[int]) -> list[int]:
        """Take the sequences of `seq_ids` that are queued and never started out of the
        engine (they hold no cache); their ids, in queue order. Safe from another thread
        while a step runs (`Scheduler.take_waiting`)."""
        taken = [s.seq_id for s in self.scheduler.take_waiting(set(seq_ids))]
        for sid in taken:
            self.seqs.pop(sid, None)
        return taken

    def step(self) -> list[TokenEvent]:
        """Run one batch; return the token each of its sequences produced."""
        step = self.scheduler.schedule()
        self.last_batch = None if step is None else step.batch
        if step is None:
            return []
        if step.preempted:
            self.executor.free([seq.seq_id for seq in step.preempted])
        # prompt pieces of a chunked prefill pick no token yet (no draw)
        draws = tuple(
            s.draw if picks else None for s, picks in zip(step.seqs, step.samples, strict=True)
        )
        out = self.executor.step(step.token_ids, step.batch, draws)
        seqs = step.seqs
        if not all(step.samples):
            for seq, q, picks in zip(seqs, step.batch.q_lens, step.samples, strict=True):
                if not picks:
                    seq.num_cached += q
            seqs = [s for s, picks in zip(seqs, step.samples, strict=True) if picks]
        events, finished = [], []
        for i, (seq, token) in enumerate(zip(seqs, out.tokens, strict=True)):
            lp = out.logprobs_of(i)
            seq.num_cached = seq.num_tokens
            seq.output_token_ids.append(token)
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                finished.append(seq.seq_id)
            cached = seq.num_prefix_hit_tokens if step.is_prefill else None
            events.append(TokenEvent(seq.seq_id, token, reason is not None, reason, lp, cached))
        if finished:
            self.executor.free(finished)
        return events

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if not p.ignore_eos and token in self.arch.eos_token_ids:
            return "stop"
        if token in p.stop_token_ids:
            return "stop"
        if len(seq.output_token_ids) >= p.max_tokens:
            return "length"
        if seq.num_tokens >= context_limit(self.arch, self.config):
            return "length"
        return None

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[Completion]:
        """Run prompts to completion with continuous batching; results in prompt order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        while self.has_unfinished:
            self.step()
        out = []
        for i in ids:
            seq = self.seqs.pop(i)
            assert seq.finish_reason is not None
            out.append(Completion(i, seq.prompt_token_ids, seq.output_token_ids, seq.finish_reason))
        return out
