"""Full local instances on a node (λScale §4.4 mode-switch target; P/D roles of BlitzScale §5.2).

`instance_open` wraps the node's full runner (its gpu-tier blocks, views, no copies) in an
`LLMEngine` and starts the instance's loop; `instance_submit` adds a request — optionally
with tokens it already generated elsewhere, whose KV cache is rebuilt by prefill;
`instance_adopt` continues a request whose K/V arrives with it (ParaServe §6 migration,
BlitzScale's P/D hand-off); `instance_abort` takes requests back out (to move them
elsewhere); `instance_queued` and `instance_take_queued` name and take back the requests
that have not started, at once, not after the step in progress (BlitzScale §4 step 1);
`generate` is a one-off run. What flows through here is the controller's ops on instances,
answered at once or queued into each instance's inbox; the loop that applies the inbox
between two steps (never during one) and emits every generated token as a `TokenGenerated`
event is `runtime/node/instance_loop.py`. The P/D side (roles, parking after prefill,
`instance_handoff`) is `runtime/node/pd.py`.
Composed into `NodeAgent` (`runtime/node/agent.py`) with the node's `NodeContext` and
`AgentStore` passed in.
"""

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from surge.emulation import traffic_charges
from surge.errors import SurgeError
from surge.policy.versions import refuse_kv
from surge.runtime.node.context import Handlers, NodeContext
from surge.runtime.node.instance_loop import run_instance
from surge.runtime.node.local_instance import LocalInstance
from surge.runtime.node.pd import AgentPd
from surge.runtime.node.store import AgentStore
from surge.runtime.protocol import (
    AbortReply,
    Ack,
    AdoptReply,
    GenerateOp,
    GenerateReply,
    InstanceAbortOp,
    InstanceAdoptOp,
    InstanceCloseOp,
    InstanceHandoffOp,
    InstanceOpenOp,
    InstanceQueuedOp,
    InstanceReply,
    InstanceRoleOp,
    InstanceSubmitOp,
    InstanceTakeQueuedOp,
    KvPart,
    KvSource,
    QueuedReply,
    RequestFailed,
    RunningHolding,
    SubmitReply,
)
from surge.runtime.transport import Connection

if TYPE_CHECKING:
    import torch

    from surge.engine.llm_engine import LLMEngine
    from surge.engine.runner import ModelRunner
    from surge.runtime.node.model_state import ModelState


log = logging.getLogger(__name__)


def kv_parts(
    parts: tuple[KvPart, ...],
    payload: memoryview,
    runner: "ModelRunner",
    where: str,
    at: tuple[str, int],
) -> list[tuple[int, "torch.Tensor"]]:
    """(first_layer, K/V tensor) of each part, cut from one payload in order (a copy: the
    frame's buffer is reused), for `runner` of `at` (model, node). A part of another
    version than the runner's weights refuses them all, before any is written
    (`policy.versions.refuse_kv`)."""
    import torch

    for part in parts:
        why = refuse_kv(*at, runner.manifest.digest, part.digest)
        if why is not None:
            raise SurgeError(f"{where}: {why}")
    dtype = runner.dtype
    out, offset = [], 0
    for part in parts:
        n = math.prod(part.shape) * dtype.itemsize
        if offset + n > len(payload):
            raise SurgeError(f"{where}: payload holds {len(payload)} bytes, parts need more")
        kv = torch.frombuffer(bytearray(payload[offset : offset + n]), dtype=dtype)
        out.append((part.first_layer, kv.view(part.shape)))
        offset += n
    return out


class AgentInstances:
    """The node's full local instances of its models."""

    def __init__(
        self,
        ctx: NodeContext,
        store: AgentStore,
        fetch_kv: Callable[[KvSource], Awaitable[tuple[KvPart, memoryview]]],
    ) -> None:
        self.ctx, self.store = ctx, store
        self.fetch_kv = fetch_kv
        """One K/V part from the stage that holds it (`AgentServing.fetch_kv`)."""
        self.instances: dict[str, LocalInstance] = {}
        self.pd = AgentPd(self.instances, self._kv_charge)

    def busy(self) -> bool:
        """Whether a request is in any local instance (queued, running, parked after its
        prefill, or its add still in the inbox)."""
        return any(
            i.engine.has_unfinished or i.inbox or i.unadded or i.parked
            for i in list(self.instances.values())
        )

    def running(self) -> tuple[RunningHolding, ...]:
        """Its instances as `status` reports them (a restarted controller adopts or closes
        them: `policy.adoption`), with the requests each holds."""
        return tuple(
            RunningHolding(
                name=name,
                model=inst.model,
                kind="instance",
                role=inst.role,
                req_ids=tuple(
                    dict.fromkeys([*inst.requests.values(), *inst.unadded, *inst.parked])
                ),
            )
            for name, inst in list(self.instances.items())
        )

    def _kv_charge(self, model: str) -> float:
        """How a K/V frame of `model` leaving this node is paced: under GPU-time emulation
        at the K/V's own real / emulated byte ratio (`surge.emulation.traffic_charges`)."""
        if self.ctx.pacer is None:
            return 1.0
        return traffic_charges(self.ctx.pacer.model, self.store.model(model).manifest).kv

    def handlers(self) -> Handlers:
        return {
            InstanceOpenOp: self.op_instance_open,
            InstanceSubmitOp: self.op_instance_submit,
            InstanceAdoptOp: self.op_instance_adopt,
            InstanceAbortOp: self.op_instance_abort,
            InstanceQueuedOp: self.op_instance_queued,
            InstanceTakeQueuedOp: self.op_instance_take_queued,
            InstanceCloseOp: self.op_instance_close,
            GenerateOp: self.op_generate,
            InstanceRoleOp: self.pd.op_instance_role,
            InstanceHandoffOp: self.pd.op_instance_handoff,
        }

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

    async def op_instance_open(
        self, op: InstanceOpenOp, conn: Connection, p: memoryview
    ) -> InstanceReply:
        from surge.engine.llm_engine import LLMEngine, LocalExecutor

        state = self._complete_model(op.model)
        if op.instance not in self.instances:
            engine = LLMEngine(state.manifest, self.ctx.config.engine, LocalExecutor(state.runner))
            inst = LocalInstance(op.instance, op.model, engine)
            inst.task = self.ctx.spawn(run_instance(self.ctx, inst))
            self.instances[op.instance] = inst
        return InstanceReply(instance=op.instance)

    async def op_instance_submit(
        self, op: InstanceSubmitOp, conn: Connection, p: memoryview
    ) -> SubmitReply:
        inst = self._instance(op.instance)
        prompt = list(op.prompt_token_ids)
        inst.engine.check_prompt(prompt)  # bad input is refused now, not at the next step

        def add(engine: "LLMEngine") -> int | None:
            if op.req_id not in inst.unadded:
                return None  # taken back before it was added (`instance_take_queued`)
            del inst.unadded[op.req_id]
            sid = engine.add_request(prompt, op.params, list(op.output_token_ids))
            inst.requests[sid] = op.req_id
            inst.fresh.add(sid)
            return sid

        # Answer at once; the loop adds the request at its next step boundary (waiting for
        # it here would hold the controller's router for a whole step per request). If the
        # add fails there, the controller hears it as the request's `RequestFailed`.
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: self._report_failed_add(inst, op.req_id, f))
        inst.unadded[op.req_id] = None
        inst.inbox.append((add, fut))
        inst.wake.set()
        return SubmitReply()

    def _report_failed_add(self, inst: LocalInstance, req_id: str, fut: asyncio.Future) -> None:
        """The loop could not add a submitted request: fail it at the controller."""
        if fut.cancelled() or fut.exception() is None:
            return
        e = fut.exception()
        log.warning("instance %s: request %s could not be added: %s", inst.name, req_id, e)
        event = RequestFailed(
            node=self.ctx.node,
            t=time.time(),
            instance=inst.name,
            req_id=req_id,
            error=f"the instance could not take the request: {e}",
            model=inst.model,
        )
        self.ctx.spawn(self.ctx.emit(event))

    async def op_instance_adopt(
        self, op: InstanceAdoptOp, conn: Connection, p: memoryview
    ) -> AdoptReply:
        """Continue a request with its KV cache (KV migration, ParaServe §6): the parts in
        the payload, or pulled here from the stages that hold them (`op.sources`)."""
        inst = self._instance(op.instance)
        runner, at = inst.engine.executor.runner, (inst.model, self.ctx.node)
        if op.sources:
            fetched = await asyncio.gather(*(self.fetch_kv(s) for s in op.sources))
            parts = [
                kv
                for part, body in fetched
                for kv in kv_parts((part,), body, runner, "instance_adopt", at)
            ]
        else:
            parts = kv_parts(op.parts, p, runner, "instance_adopt", at)

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
            out.update(self.pd.take_parked(inst, wanted))
            return out

        return AbortReply(outputs=await inst.call(abort))

    async def op_instance_queued(
        self, op: InstanceQueuedOp, conn: Connection, p: memoryview
    ) -> QueuedReply:
        return QueuedReply(req_ids=tuple(self._instance(op.instance).queued()))

    async def op_instance_take_queued(
        self, op: InstanceTakeQueuedOp, conn: Connection, p: memoryview
    ) -> QueuedReply:
        inst = self._instance(op.instance)
        return QueuedReply(req_ids=tuple(inst.take_queued(set(op.req_ids))))

    async def op_instance_close(self, op: InstanceCloseOp, conn: Connection, p: memoryview) -> Ack:
        inst = self.instances.pop(op.instance, None)
        if inst is not None and inst.task is not None:
            inst.task.cancel()
        return Ack()

    def close_model(self, model: str) -> int:
        """Close every instance of `model` (it is being dropped); how many."""
        names = [n for n, inst in self.instances.items() if inst.model == model]
        for name in names:
            inst = self.instances.pop(name)
            if inst.task is not None:
                inst.task.cancel()
        return len(names)

    async def op_generate(self, op: GenerateOp, conn: Connection, p: memoryview) -> GenerateReply:
        """Generation with this node's gpu-tier blocks (a one-off full local instance)."""
        state = self._complete_model(op.model)

        def run() -> list[int]:
            from surge.engine.llm_engine import LLMEngine, LocalExecutor

            engine = LLMEngine(state.manifest, self.ctx.config.engine, LocalExecutor(state.runner))
            return engine.generate([list(op.prompt_token_ids)], op.params)[0].token_ids

        return GenerateReply(token_ids=tuple(await asyncio.to_thread(run)))
