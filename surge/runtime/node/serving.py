"""Pipeline stages on a node (serve while loading).

Pipeline stages (λScale §4.3): `stage_open` makes a runner over a layer range from the
node's gpu-tier blocks (views, no copies) with the KV cache of exactly those layers;
`stage_step` runs one micro-batch — token ids at the head stage, hidden states elsewhere —
and hands the result to the next stage over the agents' own connections; the last stage
picks each row's next token from its logits (`engine/sampling.py` `sample`, by the step's
`draws`: a seeded token's generator is a function of its seed and position, so a stage
keeps nothing between steps) and the token ids travel back along the chain to whoever sent
the step (the pipeline's head engine). `stage_free` drops finished sequences along the
whole chain. Several micro-batches may be in the chain at once (2D pipelining): each stage
computes one at a time, in a worker thread, so the agent keeps serving the network.

`kv_export` copies one sequence's K/V out of a stage (migration); `fetch_kv` gets one such
part for this node's own instances (`instance_adopt` with sources: from this node's stage,
or from a peer's by `kv_export`, agent to agent). Full local instances are
`runtime/node/instances.py`; FlexPipe's refactoring ops on these stages are
`runtime/node/refactor.py`.

Composed into `NodeAgent` (`runtime/node/agent.py`) with the node's `NodeContext` and its
`AgentStore` (whose gpu-tier blocks it runs) passed in.
"""

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from surge.emulation import TrafficCharges, traffic_charges
from surge.engine.sampling import sample
from surge.errors import SurgeError
from surge.policy.versions import refuse_stage
from surge.runtime.node.context import Handlers, NodeContext
from surge.runtime.node.refactor import refactor_handlers
from surge.runtime.node.stage import Stage
from surge.runtime.node.store import AgentStore
from surge.runtime.protocol import (
    Ack,
    KvExportOp,
    KvPart,
    KvSource,
    PipelineReply,
    RunningHolding,
    StageCloseOp,
    StageFreeOp,
    StageOpenOp,
    StageStepOp,
    StageStepReply,
    ok_header,
)
from surge.runtime.transport import Connection

if TYPE_CHECKING:
    from surge.engine.runner import ModelRunner

log = logging.getLogger(__name__)

NO_CHARGES = TrafficCharges(hidden=1.0, kv=1.0)
"""Frames paced as their bytes (not emulated)."""


class AgentServing:
    """The pipeline stages this node runs."""

    def __init__(self, ctx: NodeContext, store: AgentStore) -> None:
        self.ctx, self.store = ctx, store
        self.stages: dict[str, Stage] = {}
        self.steps_in_flight = 0
        """Stage steps running now (the node is busy: `busy`)."""
        self.group_locks: dict[str, asyncio.Lock] = {}
        """`StageOpenOp.compute_group` -> the lock its stages share."""
        self._stage_pool: dict[int, list[Connection]] = {}

    def busy(self) -> bool:
        """Whether a stage step runs now."""
        return self.steps_in_flight > 0

    def handlers(self) -> Handlers:
        return {
            StageOpenOp: self.op_stage_open,
            StageStepOp: self.op_stage_step,
            StageFreeOp: self.op_stage_free,
            StageCloseOp: self.op_stage_close,
            KvExportOp: self.op_kv_export,
            # FlexPipe refactoring and profiling
            **refactor_handlers(self._stage, self.ctx.node, self._peer_conn, self.ctx.pacer),
        }

    def close(self) -> None:
        for conns in self._stage_pool.values():
            for conn in conns:
                conn.close()

    def _stage(self, pipeline: str) -> Stage:
        stage = self.stages.get(pipeline)
        if stage is None:
            raise SurgeError(f"no stage of pipeline {pipeline} on node {self.ctx.node}")
        return stage

    # ---- pipeline stages ---------------------------------------------------------

    def _stage_runner(self, model: str, first: int, end: int) -> "ModelRunner":
        from surge.engine.runner import ModelRunner

        state = self.store.model(model)
        manifest = state.manifest
        needed = set(manifest.blocks_for_layers(first, end))
        if first == 0:
            needed.add(0)
        if end == manifest.arch.num_layers:
            needed.add(manifest.num_blocks - 1)
        missing = sorted(b for b in needed if b not in state.device_blocks)
        if missing:
            raise SurgeError(
                f"node {self.ctx.node} lacks blocks {missing} for layers {first}-{end - 1}"
            )
        memory = self.store.device.memory()
        config, gate = self.ctx.config.engine, self.ctx.compile_gate
        runner = ModelRunner(manifest, config, (first, end), memory=memory, compile_gate=gate)
        for b in sorted(needed):  # the gpu tier's device copy itself: no second copy
            runner.install_block(b, state.device_blocks[b])
        return runner

    async def op_stage_open(
        self, op: StageOpenOp, conn: Connection, p: memoryview
    ) -> PipelineReply:
        first, end = op.first_layer, op.end_layer
        held = self.store.model(op.model).manifest.digest
        why = refuse_stage(op.model, self.ctx.node, held, op.digest)
        if why is not None:  # its layers would run on another version's hidden states
            raise SurgeError(f"stage_open {op.pipeline}: {why}")
        runner = await asyncio.to_thread(self._stage_runner, op.model, first, end)
        stage = Stage(
            op.pipeline, op.model, first, end, op.next_node, runner, compute_group=op.compute_group
        )
        if op.compute_group is not None:  # one step at a time across the group
            stage.group_lock = self.group_locks.setdefault(op.compute_group, asyncio.Lock())
        self.stages[op.pipeline] = stage
        return PipelineReply(pipeline=op.pipeline)

    async def op_stage_step(self, op: StageStepOp, conn: Connection, p: memoryview) -> None:
        import torch

        from surge.engine.hidden import hidden_from_bytes, hidden_to_bytes

        stage = self._stage(op.pipeline)
        pacer = self.ctx.pacer
        # a live prefill's stage (BlitzScale §5.2): its step goes before the local instance's
        # next one from now on, even while it waits for its group (`StepPacer.arrive`)
        live = op.pipeline if stage.compute_group is not None else None
        if pacer is not None and live is not None:
            pacer.arrive(live)

        def compute() -> tuple[StageStepOp | StageStepReply, Any, tuple[int, float, float]]:
            # under emulation the agent's one GPU: its local instance's step in progress first
            # (a live batch's last layers on a partner busy prefilling its own batch)
            gpu = contextlib.nullcontext(0.0) if pacer is None else pacer.step(live)
            with gpu as started_s:
                t0 = time.time()
                out = run()
                if pacer is not None:  # the stage's share of the emulated model's layers
                    layers = stage.runner.arch.num_layers
                    pacer.pace(started_s, out[2], stage.first_layer, stage.end_layer, layers)
                return out[0], out[1], (self.ctx.node, t0, time.time())

        def run() -> tuple[StageStepOp | StageStepReply, Any, tuple[int, ...]]:
            if op.kind == "tokens":
                assert op.batch is not None and op.shape is not None  # checked by StageStepOp
                batch = op.batch
                tokens = torch.frombuffer(bytearray(p), dtype=torch.int64).view(op.shape)
                hidden = stage.runner.embed(tokens)
            else:
                hidden, batch, _ = hidden_from_bytes(p)
            hidden = stage.runner.run_layers(stage.first_layer, stage.end_layer, hidden, batch)
            if stage.next_node is None:  # token ids back, not vocab x 4 bytes of logits a row
                sampled = sample(stage.runner.logits(hidden, batch), op.draws, batch)
                return StageStepReply(sampled=sampled), b"", batch.q_lens
            forward = StageStepOp(pipeline=stage.pipeline, kind="hidden", draws=op.draws)
            return forward, hidden_to_bytes(hidden, batch), batch.q_lens

        self.steps_in_flight += 1
        try:
            # the group's turn first, then this stage's cache (which an export also takes):
            # a live batch's K/V export waits for its own stage's step, never for the next
            # batch's step queued for the GPU (until 2026-11-29 the group's lock was the
            # stage's: on the emulated §6.1 7B run live batch 8-11's hand-offs waited from
            # its first tokens at 1.682 s until batch 12-14's step on the partner ended at
            # 2.151, their second tokens 2.295-2.627 s)
            async with stage.group_lock or contextlib.nullcontext(), stage.lock:
                out, payload, span = await asyncio.to_thread(compute)
        finally:
            self.steps_in_flight -= 1
            if pacer is not None and live is not None:
                pacer.leave(live)  # ran already, or will not
        pace = self._charges(stage.model).hidden
        if isinstance(out, StageStepOp):  # hand on to the next stage; its tokens come back
            async with self._peer_conn(stage.next_node) as nxt:
                reply, payload = await nxt.request(out.to_json(), payload, pace=pace)
            later = StageStepReply.from_json(reply)
            out = replace(later, spans=(span, *later.spans))
        else:
            out = replace(out, spans=(span,))
        await conn.send(ok_header(out), payload, pace)

    async def op_stage_free(self, op: StageFreeOp, conn: Connection, p: memoryview) -> Ack:
        stage = self.stages.get(op.pipeline)
        if stage is None:  # already closed: nothing to free
            return Ack()
        for sid in op.seq_ids:
            stage.runner.free(sid)
        if stage.next_node is not None:
            async with self._peer_conn(stage.next_node) as nxt:
                await nxt.request(op.to_json())
        return Ack()

    async def op_stage_close(self, op: StageCloseOp, conn: Connection, p: memoryview) -> Ack:
        self.stages.pop(op.pipeline, None)
        return Ack()

    def running(self) -> tuple[RunningHolding, ...]:
        """Its stages as `status` reports them, each with its layers, next node and the
        sequences it holds K/V of (a restarted controller adopts their pipeline or closes
        them: `policy.adoption`)."""
        return tuple(
            RunningHolding(
                name=name,
                model=stage.model,
                kind="stage",
                first_layer=stage.first_layer,
                end_layer=stage.end_layer,
                next_node=stage.next_node,
                compute_group=stage.compute_group,
                seq_ids=stage.runner.kv.seq_ids(),
            )
            for name, stage in list(self.stages.items())
        )

    def close_model(self, model: str) -> int:
        """Close every stage of `model` (it is being dropped); how many."""
        names = [n for n, stage in self.stages.items() if stage.model == model]
        for name in names:
            del self.stages[name]
        return len(names)

    async def _export(self, pipeline: str, seq_id: int, num_tokens: int) -> tuple[KvPart, Any]:
        """K/V of one sequence's first `num_tokens` tokens at this node's stage of
        `pipeline`: its part and its bytes (a uint8 array)."""
        import torch

        stage = self._stage(pipeline)
        async with stage.lock:  # never while a step writes this stage's cache
            kv = await asyncio.to_thread(stage.runner.export_kv, seq_id, num_tokens)
        digest = stage.runner.manifest.digest  # its receiver refuses another version's
        part = KvPart(stage.first_layer, stage.end_layer, tuple(kv.shape), digest)
        return part, kv.contiguous().view(-1).view(torch.uint8).numpy()

    async def op_kv_export(self, op: KvExportOp, conn: Connection, p: memoryview) -> None:
        """K/V of one sequence's first `num_tokens` tokens at this stage (for migration)."""
        part, body = await self._export(op.pipeline, op.seq_id, op.num_tokens)
        await conn.send(ok_header(part), body, self._charges(self._stage(op.pipeline).model).kv)

    async def fetch_kv(self, src: KvSource) -> tuple[KvPart, memoryview]:
        """One part of a sequence's K/V for an instance on this node: from this node's own
        stage, else from `src.node`'s by `kv_export` over a peer connection (agent to
        agent: the bytes never pass through the controller). Raises `RemoteError` if the
        stage no longer holds the sequence."""
        if src.node == self.ctx.node:
            part, body = await self._export(src.pipeline, src.seq_id, src.num_tokens)
            return part, memoryview(body)
        op = KvExportOp(pipeline=src.pipeline, seq_id=src.seq_id, num_tokens=src.num_tokens)
        async with self._peer_conn(src.node) as c:
            header, body = await c.request(op.to_json())
        return KvPart.from_json(header), body

    def _charges(self, model: str) -> TrafficCharges:
        """How this node's activation and K/V frames of `model` are paced: under GPU-time
        emulation at their own real / emulated byte ratios, else as their bytes."""
        if self.ctx.pacer is None:
            return NO_CHARGES
        return traffic_charges(self.ctx.pacer.model, self.store.model(model).manifest)

    # ---- pooled connections for stage traffic -----------------------------------

    @contextlib.asynccontextmanager
    async def _peer_conn(self, node: int | None):
        """A connection to a peer for one exchange; several may be open at once, so
        micro-batches in flight do not queue behind each other's round trips."""
        assert node is not None
        free = self._stage_pool.setdefault(node, [])
        conn = free.pop() if free else None
        if conn is None or conn.closed:
            conn = await self.ctx.dial(node)
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        else:
            free.append(conn)
