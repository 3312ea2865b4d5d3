"""Taking back requests an agent's instance has not started (BlitzScale §4 step 1: a live
target redirects the requests queued on its source; §5.2 step 3: they go back to the router
once the target serves). `instance_queued` names them and `instance_take_queued` gives back
those asked for — at once, while the instance's step in progress still runs (under GPU-time
emulation a step lasts D times its emulated time: waiting for its end cost the emulated
§6.1 run +0.28 s on three requests) — and never one that has started."""

import asyncio
import threading

import numpy as np

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import Sampled, SamplingParams
from surge.runtime.node.instance_loop import run_instance
from surge.runtime.node.instances import AgentInstances
from surge.runtime.node.local_instance import LocalInstance
from surge.runtime.protocol import (
    InstanceQueuedOp,
    InstanceSubmitOp,
    InstanceTakeQueuedOp,
    TokenGenerated,
)
from tests.runtime.test_instance_failure import Ctx  # what an instance's loop uses of its agent

NO_PAYLOAD = memoryview(b"")
WAIT_S = 10.0
"""Bound on every wait (a hang fails the test, never blocks the suite)."""


class GatedExecutor:
    """Runs no model: each forward waits until the test opens the gate (a step in
    progress, as long as the test likes), then answers token 0 for each row."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[tuple[int, ...]] = []

    def step(self, token_ids: np.ndarray, batch: BatchMeta, draws: tuple) -> Sampled:
        self.batches.append(batch.seq_ids)
        self.entered.set()
        assert self.gate.wait(WAIT_S), "the test never ended the step"
        return Sampled((0,) * sum(d is not None for d in draws))

    def free(self, seq_ids: list[int]) -> None:
        return None


def test_queued_requests_come_back_while_a_step_runs_and_started_ones_stay(manifest) -> None:
    """One sequence at a time: r0's step is under way (held open), r1 and r2 wait in the
    engine's queue and r3, submitted during the step, waits in the inbox. All three are
    named queued; asked for r0, r2 and r3, the agent gives back r2 and r3 while r0's step
    still runs. Then r0 and r1 are served here and r2 and r3 never are."""
    config = EngineConfig(max_num_seqs=1, device="cpu")
    executor = GatedExecutor(manifest.arch.vocab_size)
    params = SamplingParams(max_tokens=1, ignore_eos=True)

    def submit(req_id: str) -> InstanceSubmitOp:
        return InstanceSubmitOp("inst", req_id, (5, 6, 7), params)

    async def run() -> tuple[Ctx, tuple[str, ...], tuple[str, ...], bool]:
        ctx = Ctx()
        agent = AgentInstances(ctx, None, None)  # type: ignore[arg-type]  # ops use ctx only
        engine = LLMEngine(manifest, config, executor)  # type: ignore[arg-type]
        inst = LocalInstance("inst", "m", engine)
        agent.instances["inst"] = inst
        task = asyncio.create_task(run_instance(ctx, inst))
        try:
            for rid in ("r0", "r1", "r2"):
                await agent.op_instance_submit(submit(rid), None, NO_PAYLOAD)  # type: ignore[arg-type]
            assert await asyncio.to_thread(executor.entered.wait, WAIT_S), "no step started"
            await agent.op_instance_submit(submit("r3"), None, NO_PAYLOAD)  # type: ignore[arg-type]
            queued = await asyncio.wait_for(
                agent.op_instance_queued(InstanceQueuedOp("inst"), None, NO_PAYLOAD),  # type: ignore[arg-type]
                WAIT_S,
            )
            op = InstanceTakeQueuedOp("inst", ("r0", "r2", "r3"))
            taken = await asyncio.wait_for(
                agent.op_instance_take_queued(op, None, NO_PAYLOAD),  # type: ignore[arg-type]
                WAIT_S,
            )
            during_step = not executor.gate.is_set()
            executor.gate.set()
            for _ in range(int(WAIT_S / 0.01)):
                if len(ctx.events) == 2 and not engine.has_unfinished and not inst.inbox:
                    break
                await asyncio.sleep(0.01)
            return ctx, queued.req_ids, taken.req_ids, during_step
        finally:
            executor.gate.set()
            task.cancel()

    ctx, queued, taken, during_step = asyncio.run(run())
    assert queued == ("r1", "r2", "r3")
    assert taken == ("r2", "r3") and during_step
    served = [e.req_id for e in ctx.events if isinstance(e, TokenGenerated) and e.finished]
    assert served == ["r0", "r1"], ctx.events
    assert len(executor.batches) == 2  # r2 and r3 never ran here
