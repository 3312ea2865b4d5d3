"""The pipeline endpoint: an execution pipeline (λScale §4.3) serving one model.

What flows: the `Server` (`runtime/server.py`) hands it `ServeRequest`s like any `Endpoint`
(`runtime/endpoints.py`); its stages run on agents (`StageOpenOp`; the last one picks the
tokens), its head engines (schedulers, no torch) here, `num_micro_batches` of them so
several micro-batches are in the chain at once (λScale Fig. 6a; FlexPipe sets the count
from `policy.flexpipe.microbatch` and changes it with the stage count, splitting the
stages' KV cache among them by `micro_batch_budgets`); each head engine, its executor and
its micro-batch stream are `runtime/pipeline_heads.py`. FlexPipe's busy merge hands a
retired engine's sequences to the engines that stay, here. `take_back` and `detach`
return unfinished requests with their tokens so far (mode switch, refactor, failover).
Owned by the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.model.manifest import Manifest
from surge.policy.flexpipe.merge import MergeMove, adoptions, merge_move, phase_of
from surge.policy.flexpipe.microbatch import micro_batch_budgets
from surge.policy.pipeline_batches import join_micro_batch
from surge.runtime.client import ClusterClient
from surge.runtime.endpoints import Endpoint, EndpointFailed
from surge.runtime.engine_loop import run_engine
from surge.runtime.pipeline_heads import SEQ_IDS_PER_GROUP, HeadGroup, RemotePipelineExecutor
from surge.runtime.protocol import StageCloseOp, StageOpenOp
from surge.runtime.request import ServeRequest

if TYPE_CHECKING:
    from surge.engine.llm_engine import TokenEvent
    from surge.engine.scheduler import Sequence

log = logging.getLogger(__name__)


class PipelineEndpoint(Endpoint):
    """An execution pipeline: stages on agents, head engines (schedulers) here."""

    def __init__(
        self,
        client: ClusterClient,
        manifest: Manifest,
        model: str,
        name: str,
        stages: list[tuple[int, int, int]],
        config: EngineConfig = EngineConfig(),
        num_micro_batches: int = 2,
        max_micro_batches: int | None = None,
    ) -> None:
        """`stages`: (node, first_layer, end_layer) in layer order. `num_micro_batches`
        head engines take requests (λScale's 2; FlexPipe's from its policy); the stages'
        KV cache (`config.max_kv_tokens`) is split among them, and a sequence is at most
        the cache over `max_micro_batches` (default: `num_micro_batches`), the most
        `set_micro_batches` may ask for later."""
        self.client, self.manifest, self.model, self.name = client, manifest, model, name
        self.stages = stages
        self.nodes = tuple(s[0] for s in stages)
        self.requests = {}
        self.config = config
        self.max_micro_batches = max(num_micro_batches, max_micro_batches or 1)
        self.num_micro_batches = num_micro_batches
        self.capacity = num_micro_batches * config.max_num_seqs
        self.groups: list[HeadGroup] = []
        self.on_failure: Any = None
        """Called (as a task) with this endpoint when a step fails."""

    @property
    def stage_key(self) -> str:
        """The name its stages are opened under on the agents."""
        return self.name

    @property
    def num_stages(self) -> int:
        """Stages busy at once: one micro-batch each, at most one per stage."""
        return min(len(self.stages), self.num_micro_batches)

    async def open(self) -> None:
        # The stages open at once: each builds its own runner and none calls another until
        # the first step (one after another, four quarter-core stages took 61 ms, on the
        # path to a scale-out's first new capacity).
        ops = [
            StageOpenOp(
                pipeline=self.name,
                model=self.model,
                first_layer=first,
                end_layer=end,
                next_node=self.stages[i + 1][0] if i + 1 < len(self.stages) else None,
                digest=self.manifest.digest,
            )
            for i, (_, first, end) in enumerate(self.stages)
        ]
        await asyncio.gather(
            *(self.client.call(node, op) for (node, _, _), op in zip(self.stages, ops, strict=True))
        )
        self.set_micro_batches(self.num_micro_batches)

    def _add_group(self) -> None:
        loop = asyncio.get_running_loop()
        group_cfg = EngineConfig(
            page_size_tokens=self.config.page_size_tokens,
            max_kv_tokens=max(
                self.config.page_size_tokens, self.config.max_kv_tokens // self.max_micro_batches
            ),
            max_num_seqs=self.config.max_num_seqs,
            max_prefill_tokens=self.config.max_prefill_tokens,
            device="cpu",
        )
        executor = RemotePipelineExecutor(self.client, loop, self.stage_key, self.stages[0][0])
        first_seq_id = len(self.groups) * SEQ_IDS_PER_GROUP
        engine = LLMEngine(self.manifest, group_cfg, executor, first_seq_id=first_seq_id)
        group = HeadGroup(engine)
        group.task = loop.create_task(self._run(group))
        self.groups.append(group)

    def set_micro_batches(self, count: int, batch_retired: bool = False) -> None:
        """Take requests on `count` head engines (micro-batches in flight) from now on:
        engines are added as needed; the ones past `count` take nothing new and finish what
        they run, unless `batch_retired` (FlexPipe's merge: `_batch_retired`); the stages'
        KV cache is re-split (`micro_batch_budgets`). Call it between steps of every engine
        (FlexPipe: inside its step gate)."""
        if not 1 <= count <= self.max_micro_batches:
            raise ValueError(f"{count} micro-batches: 1 to {self.max_micro_batches}")
        if batch_retired and self.merge_gate is None and any(g.task for g in self.groups):
            raise ValueError("a merge that batches the retired engines needs merge_gate")
        while len(self.groups) < count:
            self._add_group()
        self.num_micro_batches = count
        self.capacity = count * self.config.max_num_seqs
        if batch_retired and len(self.groups) > count:
            self._batch_retired()
        self.rebalance_kv()

    def _batch_retired(self) -> None:
        """The engines past the count hand their sequences to those that stay, each as its
        phase says (`policy.flexpipe.merge.merge_move`; the simulator's `BusyMerge.retire`,
        `sim/serving_merge.py`): a decoding one keeps its id, so its K/V stays where it is
        at the stages, and joins the next step of its new engine (`_adopt`); one partway
        through its prefill finishes it here first (`hand_over_prefilled`); requests not
        started move to its queue. Between steps of every engine only."""
        count = self.num_micro_batches
        active, retired = self.groups[:count], self.groups[count:]
        decoding: list[list[Sequence]] = []
        fresh: list[ServeRequest] = []
        for g in retired:
            moves = self._merge_moves(g)
            running = g.engine.scheduler.running
            decoding.append([s for s in running if moves[s.seq_id] is MergeMove.JOIN_NOW])
            g.after_prefill = {sid for sid, m in moves.items() if m is MergeMove.AFTER_PREFILL}
            queued = [
                s.seq_id
                for s in g.engine.scheduler.waiting
                if moves[s.seq_id] is MergeMove.QUEUE_NOW
            ]
            fresh += [g.seqs.pop(sid) for sid in g.engine.take_waiting(queued)]
            fresh += g.pending
            g.pending.clear()
        self._adopt(active, retired, decoding)
        for req in fresh:
            g = active[join_micro_batch([len(g.seqs) + len(g.pending) for g in active])]
            g.pending.append(req)
            g.wake.set()

    @staticmethod
    def _merge_moves(group: HeadGroup) -> dict[int, MergeMove]:
        """Each sequence of a retired engine (by id), running then queued, and what the
        merge does with it (`phase_of`: one never started has no token and nothing cached)."""
        sched = group.engine.scheduler
        unstarted = set(sched.unstarted())
        return {
            s.seq_id: merge_move(phase_of(s.seq_id not in unstarted, s.num_tokens - s.num_cached))
            for s in (*sched.running, *sched.waiting)
        }

    def _adopt(
        self, active: list[HeadGroup], retired: list[HeadGroup], decoding: list[list[Sequence]]
    ) -> None:
        """`retired[i]`'s `decoding[i]` sequences (its running order) to the active engines
        by `adoptions`; those no engine has room for stay. Between steps of every engine."""
        moves = adoptions(
            [len(g.engine.scheduler.running) for g in active],
            [len(d) for d in decoding],
            self.config.max_num_seqs,
        )
        handed = []
        for src, i, dst in moves:
            seq = retired[src].engine.hand_over(decoding[src][i].seq_id)
            handed.append((seq, retired[src].seqs.pop(seq.seq_id), active[dst]))
        self.rebalance_kv()  # the pages the retired engines gave back go to the active ones
        for seq, req, g in handed:
            if g.engine.take_over(seq):
                g.seqs[seq.seq_id] = req
            else:  # no page room after all: recomputed there (λScale §4.4), none lost
                g.engine.executor.free([seq.seq_id])
                g.pending.append(req)
            g.wake.set()

    def prefills_done(self, group: HeadGroup) -> bool:
        """Whether a sequence of `group` the merge left to finish its prefill
        (`MergeMove.AFTER_PREFILL`) has finished it, or ended: `hand_over_prefilled` now."""
        seqs = group.engine.seqs
        return any(
            sid not in seqs or seqs[sid].num_tokens - seqs[sid].num_cached == 1
            for sid in group.after_prefill
        )

    def hand_over_prefilled(self, group: HeadGroup) -> None:
        """At a step boundary of a retired engine (FlexPipe: under `merge_gate`, between
        steps of every engine), its sequences the merge left to finish their prefill that
        now decode are offered to the active engines (`_adopt`); the others wait on."""
        count = self.num_micro_batches
        if group in self.groups[:count]:  # a split made it active again meanwhile
            group.after_prefill.clear()
            return
        moves = self._merge_moves(group)
        ready = [
            s
            for s in group.engine.scheduler.running
            if s.seq_id in group.after_prefill and moves[s.seq_id] is MergeMove.JOIN_NOW
        ]
        group.after_prefill &= {sid for sid, m in moves.items() if m is MergeMove.AFTER_PREFILL}
        self._adopt(self.groups[:count], [group], [ready])

    def kv_budgets(self) -> tuple[int, ...]:
        """The KV pages each engine should be allowed now (`micro_batch_budgets`)."""
        held = [g.engine.scheduler.held_pages for g in self.groups]
        budgets = [g.budget_pages for g in self.groups]
        total = self.config.num_pages
        return micro_batch_budgets(total, held, budgets, self.num_micro_batches)

    def rebalance_kv(self) -> None:
        """Give every engine its `kv_budgets` page budget; between steps only."""
        for group, pages in zip(self.groups, self.kv_budgets(), strict=True):
            group.engine.scheduler.set_budget_pages(pages)
            group.budget_pages = pages

    async def submit(self, req: ServeRequest) -> None:
        if self.failed:
            raise EndpointFailed(self.name)
        self.requests[req.req_id] = req
        active = self.groups[: self.num_micro_batches]  # its micro-batch: `join_micro_batch`
        group = active[join_micro_batch([len(g.seqs) + len(g.pending) for g in active])]
        group.pending.append(req)
        group.wake.set()

    async def _run(self, group: HeadGroup) -> None:
        engine = group.engine

        def admit() -> None:
            for req in group.pending:
                sid = engine.add_request(req.prompt_token_ids, req.params, req.output_token_ids)
                group.seqs[sid] = req
            group.pending.clear()

        async def deliver(events: list[TokenEvent]) -> None:
            for ev in events:
                req = group.seqs.get(ev.seq_id)
                if req is None:
                    continue
                if ev.logprobs is not None:
                    req.add_logprobs(ev.logprobs)
                if ev.num_cached_tokens is not None:
                    req.cached_tokens = ev.num_cached_tokens
                req.add_token(ev.token_id, ev.finished, ev.finish_reason)
                self.num_tokens += 1
                if ev.finished:
                    del group.seqs[ev.seq_id]
                    self.requests.pop(req.req_id, None)
            if group.after_prefill and self.prefills_done(group):  # a merge retired it
                async with self.merge_gate() if self.merge_gate else contextlib.nullcontext():
                    self.hand_over_prefilled(group)

        try:
            await run_engine(engine, group.wake, admit, deliver, self.step_gate)
        except EndpointFailed as e:
            log.warning("%s failed: %s", self.name, e)
            self.failed = True
            if self.on_failure is not None:
                asyncio.get_running_loop().create_task(self.on_failure(self))

    step_gate: Callable[[], AbstractAsyncContextManager[None]] | None = None
    """Wraps each head-engine step (None: none); FlexPipe's pipelines set their gate."""
    merge_gate: Callable[[], AbstractAsyncContextManager[None]] | None = None
    """Held alone, between steps of every engine (FlexPipe: its gate's `exclusive`); a
    merge's sequences left to finish their prefill move under it (`hand_over_prefilled`).
    None: only with engines no task steps (a caller steps them, as the tests)."""

    def detach(self) -> list[tuple[ServeRequest, int]]:
        """Stop the head engines now, keep the stages (and their KV caches) open, and return
        each unfinished request with its sequence id at the stages. A step in flight is
        abandoned: a request's KV length is what its tokens say (prompt + output - 1)."""
        out: list[tuple[ServeRequest, int]] = []
        for group in self.groups:
            if group.task is not None:
                group.task.cancel()
            out += [(req, sid) for sid, req in group.seqs.items()]
            out += [(req, -1) for req in group.pending]
            group.seqs.clear()
            group.pending.clear()
        self.requests = {}
        return out

    async def close_stages(self) -> None:
        for node, _, _ in self.stages:
            with contextlib.suppress(Exception):
                await self.client.call(node, StageCloseOp(pipeline=self.name))

    async def take_back(self) -> list[ServeRequest]:
        """Stop every head engine now and hand back what is unfinished.

        A step still in flight is abandoned, not awaited: its tokens are never appended
        (the task is cancelled before it returns), so a moved request continues from
        exactly the tokens it has — none lost, none twice — and a mode switch does not wait
        for a slow step.
        """
        taken = [req for req, _ in self.detach()]
        if not self.failed:
            await self.close_stages()
        return taken
