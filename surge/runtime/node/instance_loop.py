"""One local instance's engine loop on a node agent (λScale §4.4 mode-switch target).

What flows through here: the `LocalInstance`'s inbox (the changes `AgentInstances`' ops
queue: adds, adopts, aborts) applied between two steps, never during one; each step, paced
under GPU-time emulation as one step of the agent's one emulated GPU (`StepPacer.step`), with
P/D prefills parked in it (`runtime/node/pd.py` `step_and_park`); and out, every generated
token as a `TokenGenerated` event, or, when a step fails, each of its requests as a
`RequestFailed` (the instance serves on). Driven by the runtime's one engine loop
(`runtime/engine_loop.py` `run_engine`); started by `AgentInstances.op_instance_open`
(`runtime/node/instances.py`).
"""

import logging
import time
from typing import TYPE_CHECKING

from surge.runtime.node.context import NodeContext
from surge.runtime.node.local_instance import LocalInstance
from surge.runtime.node.pd import step_and_park
from surge.runtime.protocol import HANDOFF_REASON, RequestFailed, TokenGenerated

if TYPE_CHECKING:
    from surge.engine.llm_engine import TokenEvent


log = logging.getLogger(__name__)


async def _fail_all(ctx: NodeContext, inst: LocalInstance, error: str) -> None:
    """Take every request out of `inst` and tell the controller each one failed
    (`RequestFailed`); the instance serves on with the requests that come next."""
    for sid, rid in list(inst.requests.items()):
        try:
            inst.engine.abort(sid)
        except Exception:  # already gone from the engine: nothing to free
            log.debug("instance %s: seq %d was not in the engine", inst.name, sid)
        del inst.requests[sid]
        inst.fresh.discard(sid)
        await ctx.emit(
            RequestFailed(
                node=ctx.node,
                t=time.time(),
                instance=inst.name,
                req_id=rid,
                error=error,
                model=inst.model,
            )
        )


def paced_step(ctx: NodeContext, inst: LocalInstance) -> tuple[list["TokenEvent"], dict[int, str]]:
    """One step (in the worker thread); under emulation it lasts what the emulated GPU
    takes for the whole emulated model at this step's shape, and the agent's other
    steps (its pipeline stages', a live batch's last layers) wait for it
    (`StepPacer.step`: one GPU)."""
    pacer = ctx.pacer
    if pacer is None:
        return step_and_park(inst)
    with pacer.step() as started_s:  # the agent's one GPU: its stages' steps wait

        def pace() -> None:  # before parking: the step's prefills end in the role it
            # has when its emulated time is up (`step_and_park`)
            batch = inst.engine.last_batch
            if batch is not None:
                layers = inst.engine.arch.num_layers
                pacer.pace(started_s, batch.q_lens, 0, layers, layers)

        return step_and_park(inst, pace)


async def run_instance(ctx: NodeContext, inst: LocalInstance) -> None:
    """Drive the instance's engine with the runtime's one loop (`run_engine`): the
    inbox's changes between steps, P/D parking in the step, tokens out as events."""
    from surge.runtime.engine_loop import run_engine  # torch: only once a model serves

    parked: dict[int, str] = {}
    """seq_id -> req_id of the requests the last step parked (P/D prefill)."""

    def admit() -> None:
        while inst.inbox:
            fn, fut = inst.inbox.pop(0)
            try:
                fut.set_result(fn(inst.engine))
            except Exception as e:  # reported to the op that asked (or its callback)
                fut.set_exception(e)

    def step() -> list["TokenEvent"]:
        events, now_parked = paced_step(ctx, inst)
        parked.clear()
        parked.update(now_parked)
        return events

    async def failed(e: Exception) -> None:  # a broken step must not leave requests hanging
        log.error("instance %s: an engine step failed", inst.name, exc_info=e)
        await _fail_all(ctx, inst, f"the engine failed a step: {type(e).__name__}: {e}")

    async def deliver(events: list["TokenEvent"]) -> None:
        for ev in events:
            rid = inst.requests.get(ev.seq_id) or parked.get(ev.seq_id)
            if rid is None:
                continue
            if ev.finished:
                del inst.requests[ev.seq_id]
            await ctx.emit(
                TokenGenerated(
                    node=ctx.node,
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

    await run_engine(inst.engine, inst.wake, admit, deliver, step=step, on_failed_step=failed)
