"""What an agent runs: pipeline stages and full local instances (serve while loading).

Pipeline stages (λScale §4.3): `stage_open` makes a runner over a layer range from the
node's gpu-tier blocks (views, no copies) with the KV cache of exactly those layers;
`stage_step` runs one micro-batch — token ids at the head stage, hidden states elsewhere —
and hands the result to the next stage over the agents' own connections; the last stage
returns float32 logits, which travel back along the chain to whoever sent the step (the
pipeline's head engine, which samples). `stage_free` drops finished sequences along the
whole chain. Several micro-batches may be in the chain at once (2D pipelining): each stage
computes one at a time, in a worker thread, so the agent keeps serving the network.

Local instances (λScale §4.4 mode switch target): `instance_open` wraps the node's full
runner in an `LLMEngine`; `instance_submit` adds a request — optionally with tokens it
already generated elsewhere, whose KV cache is rebuilt by prefill; generated tokens go out as
`token` events. `instance_abort` takes requests back out (to move them elsewhere).

Composed into `NodeAgent` (`runtime/agent.py`) with the node's `NodeContext` and its
`AgentStore` (whose gpu-tier blocks it runs) passed in.
"""

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from surge.errors import SurgeError
from surge.runtime.agent_context import Handlers, NodeContext
from surge.runtime.agent_pd import AgentPd, Parked, step_and_park
from surge.runtime.agent_refactor import refactor_handlers
from surge.runtime.agent_store import AgentStore
from surge.runtime.protocol import (
    AbortReply,
    Ack,
    AdoptReply,
    GenerateOp,
    GenerateReply,
    InstanceAbortOp,
    InstanceAdoptOp,
    InstanceCloseOp,
    InstanceOpenOp,
    InstanceReply,
    InstanceSubmitOp,
    KvExportOp,
    KvPart,
    PipelineReply,
    StageCloseOp,
    StageFreeOp,
    StageOpenOp,
    StageStepOp,
    StageStepReply,
    SubmitReply,
    TokenGenerated,
)
from surge.runtime.protocol_ops import HANDOFF_REASON, InstanceHandoffOp, InstanceRoleOp
from surge.runtime.transport import Connection

if TYPE_CHECKING:
    from surge.engine.llm_engine import LLMEngine
    from surge.engine.runner import ModelRunner
    from surge.runtime.agent_store import ModelState

log = logging.getLogger(__name__)


@dataclass
class Stage:
    """One stage of a pipeline on this node."""

    pipeline: str
    model: str
    first_layer: int
    end_layer: int
    next_node: int | None
    runner: "ModelRunner"
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class LocalInstance:
    """A full copy of a model on this node, serving requests with continuous batching."""

    name: str
    model: str
    engine: "LLMEngine"
    requests: dict[int, str] = field(default_factory=dict)
    """seq_id -> the controller's request id."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    inbox: list[tuple[Callable[["LLMEngine"], Any], asyncio.Future]] = field(default_factory=list)
    """Changes to the engine, applied by its loop between steps (never during one)."""
    role: str = "decode"
    """P/D role (`runtime/agent_pd.py`): "prefill" parks requests after their prefill."""
    fresh: set[int] = field(default_factory=set)
    """Submitted sequences that have produced no token here yet (their prefill is next)."""
    parked: dict[str, "Parked"] = field(default_factory=dict)
    """req_id -> a request parked after its prefill, waiting for `instance_handoff`."""

    async def call(self, fn: Callable[["LLMEngine"], Any]) -> Any:
        """Run `fn(engine)` between two steps and return its result."""
        fut = asyncio.get_running_loop().create_future()
        self.inbox.append((fn, fut))
        self.wake.set()
        return await fut


class AgentServing:
    """The models this node runs: pipeline stages and full local instances."""

    def __init__(self, ctx: NodeContext, store: AgentStore) -> None:
        self.ctx, self.store = ctx, store
        self.stages: dict[str, Stage] = {}
        self.instances: dict[str, LocalInstance] = {}
        self._stage_pool: dict[int, list[Connection]] = {}
        self.pd = AgentPd(self.instances)

    def handlers(self) -> Handlers:
        return {
            StageOpenOp: self.op_stage_open,
            StageStepOp: self.op_stage_step,
            StageFreeOp: self.op_stage_free,
            StageCloseOp: self.op_stage_close,
            KvExportOp: self.op_kv_export,
            InstanceOpenOp: self.op_instance_open,
            InstanceSubmitOp: self.op_instance_submit,
            InstanceAdoptOp: self.op_instance_adopt,
            InstanceAbortOp: self.op_instance_abort,
            InstanceCloseOp: self.op_instance_close,
            GenerateOp: self.op_generate,
            **refactor_handlers(self._stage),  # FlexPipe refactoring and profiling
            InstanceRoleOp: self.pd.op_instance_role,
            InstanceHandoffOp: self.pd.op_instance_handoff,
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

    def _instance(self, name: str) -> LocalInstance:
        inst = self.instances.get(name)
        if inst is None:
            raise SurgeError(f"no instance {name} on node {self.ctx.node} (instance_open first)")
        return inst

    def _complete_model(self, model: str) -> "ModelState":
        state = self.store.model(model)
        if not state.complete_in_gpu:
            raise SurgeError(f"node {self.ctx.node} does not hold every block of {model} in gpu")
        return state

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
        missing = sorted(b for b in needed if b not in state.gpu_buffers)
        if missing:
            raise SurgeError(
                f"node {self.ctx.node} lacks blocks {missing} for layers {first}-{end - 1}"
            )
        runner = ModelRunner(manifest, self.ctx.config.engine, layer_range=(first, end))
        for b in sorted(needed):
            runner.add_block(b, state.gpu_buffers[b], verify=False)
        return runner

    async def op_stage_open(
        self, op: StageOpenOp, conn: Connection, p: memoryview
    ) -> PipelineReply:
        first, end = op.first_layer, op.end_layer
        runner = await asyncio.to_thread(self._stage_runner, op.model, first, end)
        self.stages[op.pipeline] = Stage(op.pipeline, op.model, first, end, op.next_node, runner)
        return PipelineReply(pipeline=op.pipeline)

    async def op_stage_step(self, op: StageStepOp, conn: Connection, p: memoryview) -> None:
        import torch

        from surge.engine.hidden import hidden_from_bytes, hidden_to_bytes

        stage = self._stage(op.pipeline)

        def compute() -> tuple[StageStepOp | StageStepReply, Any]:
            if op.kind == "tokens":
                assert op.batch is not None and op.shape is not None  # checked by StageStepOp
                batch = op.batch
                tokens = torch.frombuffer(bytearray(p), dtype=torch.int64).view(op.shape)
                hidden = stage.runner.embed(tokens)
            else:
                hidden, batch, _ = hidden_from_bytes(p)
            hidden = stage.runner.run_layers(stage.first_layer, stage.end_layer, hidden, batch)
            if stage.next_node is None:
                logits = stage.runner.logits(hidden, batch).contiguous()
                return StageStepReply(shape=tuple(logits.shape)), logits.numpy()
            forward = StageStepOp(pipeline=stage.pipeline, kind="hidden")
            return forward, hidden_to_bytes(hidden, batch)

        async with stage.lock:
            out, payload = await asyncio.to_thread(compute)
        if isinstance(out, StageStepOp):  # hand on to the next stage; its logits come back
            async with self._peer_conn(stage.next_node) as nxt:
                reply, payload = await nxt.request(out.to_json(), payload)
            out = StageStepReply.from_json(reply)
        await conn.send({"ok": True, **out.to_json()}, payload)

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

    async def op_kv_export(self, op: KvExportOp, conn: Connection, p: memoryview) -> None:
        """K/V of one sequence's first `num_tokens` tokens at this stage (for migration)."""
        import torch

        stage = self._stage(op.pipeline)
        async with stage.lock:  # never while a step writes this stage's cache
            kv = await asyncio.to_thread(stage.runner.export_kv, op.seq_id, op.num_tokens)
        part = KvPart(first_layer=stage.first_layer, end_layer=stage.end_layer, shape=kv.shape)
        await conn.send(
            {"ok": True, **part.to_json()}, kv.contiguous().view(-1).view(torch.uint8).numpy()
        )

    # ---- local instances ---------------------------------------------------------

    async def op_instance_open(
        self, op: InstanceOpenOp, conn: Connection, p: memoryview
    ) -> InstanceReply:
        from surge.engine.llm_engine import LLMEngine, LocalExecutor

        state = self._complete_model(op.model)
        if op.instance not in self.instances:
            engine = LLMEngine(state.manifest, self.ctx.config.engine, LocalExecutor(state.runner))
            inst = LocalInstance(op.instance, op.model, engine)
            inst.task = self.ctx.spawn(self._instance_loop(inst))
            self.instances[op.instance] = inst
        return InstanceReply(instance=op.instance)

    async def op_instance_submit(
        self, op: InstanceSubmitOp, conn: Connection, p: memoryview
    ) -> SubmitReply:
        inst = self._instance(op.instance)
        prompt = list(op.prompt_token_ids)
        inst.engine.check_prompt(prompt)  # bad input is refused now, not at the next step

        def add(engine: "LLMEngine") -> int:
            sid = engine.add_request(prompt, op.params, list(op.output_token_ids))
            inst.requests[sid] = op.req_id
            inst.fresh.add(sid)
            return sid

        # Answer at once; the loop adds the request at its next step boundary (waiting for
        # it here would hold the controller's router for a whole step per request).
        fut = asyncio.get_running_loop().create_future()
        inst.inbox.append((add, fut))
        inst.wake.set()
        return SubmitReply()

    async def op_instance_adopt(
        self, op: InstanceAdoptOp, conn: Connection, p: memoryview
    ) -> AdoptReply:
        """Continue a request whose KV cache arrives with it (KV migration, ParaServe §6)."""
        import torch

        inst = self._instance(op.instance)
        dtype = inst.engine.executor.runner.dtype
        parts, offset = [], 0
        for part in op.parts:
            n = math.prod(part.shape) * dtype.itemsize
            if offset + n > len(p):
                raise SurgeError(f"instance_adopt: payload holds {len(p)} bytes, parts need more")
            kv = torch.frombuffer(bytearray(p[offset : offset + n]), dtype=dtype)
            parts.append((part.first_layer, kv.view(part.shape)))
            offset += n

        def adopt(engine: "LLMEngine") -> int:
            sid = engine.adopt(
                list(op.prompt_token_ids), op.params, list(op.output_token_ids), op.num_cached
            )
            for first_layer, kv in parts:
                engine.executor.runner.import_kv(sid, first_layer, kv)
            return sid

        sid = await inst.call(adopt)
        inst.requests[sid] = op.req_id
        return AdoptReply(seq_id=sid)

    async def op_instance_abort(
        self, op: InstanceAbortOp, conn: Connection, p: memoryview
    ) -> AbortReply:
        """Take requests out of a local instance; answers their tokens so far."""
        inst = self._instance(op.instance)
        wanted = set(op.req_ids)

        def abort(engine: "LLMEngine") -> dict[str, tuple[int, ...]]:
            out = {}
            for sid, rid in list(inst.requests.items()):
                if rid in wanted:
                    out[rid] = tuple(engine.abort(sid).output_token_ids)
                    del inst.requests[sid]
            for rid in wanted & set(inst.parked):
                out[rid] = inst.parked.pop(rid).reply.output_token_ids
            return out

        return AbortReply(outputs=await inst.call(abort))

    async def op_instance_close(self, op: InstanceCloseOp, conn: Connection, p: memoryview) -> Ack:
        inst = self.instances.pop(op.instance, None)
        if inst is not None and inst.task is not None:
            inst.task.cancel()
        return Ack()

    async def op_generate(self, op: GenerateOp, conn: Connection, p: memoryview) -> GenerateReply:
        """Generation with this node's gpu-tier blocks (a one-off full local instance)."""
        state = self._complete_model(op.model)

        def run() -> list[int]:
            from surge.engine.llm_engine import LLMEngine, LocalExecutor

            engine = LLMEngine(state.manifest, self.ctx.config.engine, LocalExecutor(state.runner))
            return engine.generate([list(op.prompt_token_ids)], op.params)[0].token_ids

        return GenerateReply(token_ids=tuple(await asyncio.to_thread(run)))

    async def _instance_loop(self, inst: LocalInstance) -> None:
        while True:
            while inst.inbox:
                fn, fut = inst.inbox.pop(0)
                try:
                    fut.set_result(fn(inst.engine))
                except Exception as e:  # reported to the op that asked
                    fut.set_exception(e)
            if not inst.engine.has_unfinished:
                inst.wake.clear()
                if inst.inbox:
                    continue
                await inst.wake.wait()
                continue
            events, parked = await asyncio.to_thread(step_and_park, inst)
            for ev in events:
                rid = inst.requests.get(ev.seq_id) or parked.get(ev.seq_id)
                if rid is None:
                    continue
                if ev.finished:
                    del inst.requests[ev.seq_id]
                    inst.engine.seqs.pop(ev.seq_id, None)
                await self.ctx.emit(
                    TokenGenerated(
                        node=self.ctx.node,
                        t=time.time(),
                        instance=inst.name,
                        req_id=rid,
                        token=ev.token_id,
                        finished=ev.finished,
                        finish_reason=HANDOFF_REASON if ev.seq_id in parked else ev.finish_reason,
                        model=inst.model,
                        logprob=ev.logprobs.logprob if ev.logprobs else None,
                        top_logprobs=ev.logprobs.top if ev.logprobs else None,
                        cached_tokens=ev.num_cached_tokens,
                    )
                )

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
