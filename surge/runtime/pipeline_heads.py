"""The head engines of an execution pipeline (λScale §4.3): what runs here, in the
controller, while the layers run on agent stages.

What flows: `RemotePipelineExecutor` is a head engine's `Executor`: each step goes out as
one `StageStepOp` to the first stage, with each row's `Draw`, and the tokens the last stage
picked come back (`StageStepReply.sampled`: token ids, and logprobs where asked; no logits,
no torch here); a free goes out as a `StageFreeOp`. `HeadGroup` is one micro-batch stream: its head
engine, the requests waiting for it, the sequences it runs and its share of the stages' KV
cache. Made and driven by `PipelineEndpoint` (`runtime/pipeline_endpoint.py`). Owned by the
runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from surge.engine.batch import BatchMeta
from surge.engine.sampling import Draw, Sampled
from surge.runtime.client import ClusterClient
from surge.runtime.endpoints import EndpointFailed
from surge.runtime.protocol import StageFreeOp, StageStepOp
from surge.runtime.request import ServeRequest

if TYPE_CHECKING:
    from surge.engine.llm_engine import LLMEngine

SEQ_IDS_PER_GROUP = 1 << 40
"""Engines sharing a pipeline's KV caches use disjoint sequence-id ranges of this size."""


class RemotePipelineExecutor:
    """The `Executor` of a head engine whose layers run on a chain of agent stages.

    Called from the engine's worker thread; the network I/O runs on the event loop.
    """

    def __init__(
        self, client: ClusterClient, loop: asyncio.AbstractEventLoop, pipeline: str, head: int
    ) -> None:
        self.client, self.loop, self.pipeline, self.head = client, loop, pipeline, head

    def step(
        self, token_ids: np.ndarray, batch: BatchMeta, draws: tuple[Draw | None, ...]
    ) -> Sampled:
        shape = tuple(token_ids.shape)
        op = StageStepOp(
            pipeline=self.pipeline, kind="tokens", shape=shape, batch=batch, draws=draws
        )
        fut = asyncio.run_coroutine_threadsafe(
            self.client.call_bytes(self.head, op, np.ascontiguousarray(token_ids)), self.loop
        )
        try:
            reply, _ = fut.result()
        except Exception as e:
            raise EndpointFailed(f"pipeline {self.pipeline}: {e}") from e
        return reply.sampled

    def free(self, seq_ids: list[int]) -> None:
        op = StageFreeOp(pipeline=self.pipeline, seq_ids=tuple(seq_ids))
        fut = asyncio.run_coroutine_threadsafe(self.client.call_bytes(self.head, op), self.loop)
        with contextlib.suppress(Exception):  # a dead stage has nothing left to free
            fut.result()


@dataclass
class HeadGroup:
    """One micro-batch stream of a pipeline: its own head engine over the shared stages."""

    engine: LLMEngine
    pending: list[ServeRequest] = field(default_factory=list)
    seqs: dict[int, ServeRequest] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    budget_pages: int = 0
    """KV pages its engine may hold (its share of the stages' cache)."""
    after_prefill: set[int] = field(default_factory=set)
    """Ids of its sequences a merge retired it with partway through their prefill: offered
    to the active engines once it is done (`PipelineEndpoint.hand_over_prefilled`)."""
