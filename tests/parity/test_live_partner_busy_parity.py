"""BlitzScale live scaling parity when the partner is busy (§4 Fig. 7 (d), §5.2): a live
batch's last S layers reach its partner, the overloaded instance, while that instance
prefills its own batch. One GPU runs one step at a time: the live batch's first tokens come
after the partner's own step and then its S layers, in the simulator (`sim/live_scaling.py`:
the batch is submitted to the partner's engine, which runs it after what it already has,
C2 of Eq. 1) and in the emulated runtime (`runtime/node/instance_loop.py`'s step and
`runtime/node/serving.py`'s stage step on one agent, paced by its `StepPacer`, whose `step`
is the agent's one emulated GPU).

Before 2026-11-29 the emulated agent ran the stage step beside its instance's step, each at
the emulated GPU's full speed: the live batch's first tokens came S layers after they
arrived, as if the partner were idle (the emulated §6.1 7B run: requests 8-11's first tokens
at 1.425 s, while their partner prefilled requests 4-7 until 1.361 s; the simulator 1.68 s).

The runtime side is real time: the pacer's time dilation makes the partner's own step last
about 0.4 s, and the bodies agree within 15%."""

import asyncio
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from surge.emulation import StepPacer
from surge.engine.batch import BatchMeta
from surge.engine.hidden import hidden_to_bytes
from surge.policy.systems import system_config
from surge.runtime.node import instance_loop
from surge.runtime.node.serving import NO_CHARGES, AgentServing
from surge.runtime.node.stage import Stage
from surge.runtime.protocol import StageStepOp
from surge.sim.costs import CostModel
from surge.sim.models import load_model
from surge.sim.request import SimRequest
from tests.parity.sim_world import busy_partner

NUM_LAYERS = 8
SYSTEM = replace(system_config("blitzscale"), pd_disaggregation=False, num_blocks=NUM_LAYERS)
OWN_TOKENS = 512
"""The partner's own batch: one prompt, every layer."""
LIVE_PROMPTS = (256, 256)
"""The live batch's prompts; their last `NUM_LAYERS - SPLIT` layers run on the partner."""
SPLIT = 3
"""Layers the new instance ran (T)."""
ARRIVES_AT = 0.25
"""When the live batch reaches the partner, as a share of the partner's own step."""
OWN_STEP_REAL_S = 0.4
"""What the partner's own step lasts in real time (sets the time dilation)."""


def _sim_first_tokens(tmp_path) -> tuple[CostModel, float, float]:
    """The partner's own first token and the live batch's, in simulated seconds."""
    partner, own = busy_partner(tmp_path, SYSTEM, NUM_LAYERS, OWN_TOKENS, 4, ARRIVES_AT)
    loop = partner.loop
    batch = [SimRequest(1 + i, 0, 0.0, n, 4) for i, n in enumerate(LIVE_PROMPTS)]
    for r in batch:  # as `LiveScaling._target_done`'s activation arriving at the source
        r.skip_layers, r.live_batch = SPLIT, 0
    partner.submit_many(batch)
    loop.run(until_s=loop.now_s + 10.0)
    assert batch[0].first_token_s == batch[1].first_token_s
    return partner.cost, own.first_token_s, batch[0].first_token_s


class _Runner:
    """The stage's runner: no model, the batch's shape only (the pacer sets the time)."""

    arch = SimpleNamespace(num_layers=NUM_LAYERS)

    def run_layers(self, first: int, end: int, hidden: torch.Tensor, batch: BatchMeta):
        return hidden

    def logits(self, hidden: torch.Tensor, batch: BatchMeta) -> torch.Tensor:
        return torch.zeros(len(batch.q_lens), 4)


def _runtime_first_tokens(cost: CostModel, monkeypatch) -> tuple[float, float]:
    """The same on one emulated agent: its local instance's step (the partner's own
    prefill) and, arriving meanwhile, the live pipeline's last stage (`op_stage_step`);
    in emulated seconds (real / D) from the instance step's start."""
    d = OWN_STEP_REAL_S / cost.prefill_s(OWN_TOKENS)
    pacer = StepPacer(load_model("llama2-7b"), "A100", d)
    pacer.cost = cost  # the simulator's cost model, as the pacer's own is the simulator's
    agent = SimpleNamespace(ctx=SimpleNamespace(pacer=pacer, node=0))

    def step_and_park(inst, pace) -> tuple[list, dict]:
        inst.engine.last_batch = BatchMeta((0,), (0,), (OWN_TOKENS,))
        pace()
        return [], {}

    monkeypatch.setattr(instance_loop, "step_and_park", step_and_park)
    inst = SimpleNamespace(engine=SimpleNamespace(arch=SimpleNamespace(num_layers=NUM_LAYERS)))
    serving = AgentServing(agent.ctx, None)  # type: ignore[arg-type]
    serving._charges = lambda model: NO_CHARGES  # type: ignore[method-assign]
    serving.stages["live-x"] = Stage("live-x", "m", SPLIT, NUM_LAYERS, None, _Runner())  # type: ignore[arg-type]
    batch = BatchMeta((0, 1), (0, 0), LIVE_PROMPTS)
    activation = hidden_to_bytes(torch.zeros(len(LIVE_PROMPTS), max(LIVE_PROMPTS), 4), batch)
    sent: list[float] = []

    async def send(header, payload, pace) -> None:
        sent.append(time.perf_counter())

    async def own_step() -> float:
        await asyncio.to_thread(instance_loop.paced_step, agent.ctx, inst)  # type: ignore[arg-type]
        return time.perf_counter()

    async def run() -> tuple[float, float]:
        t0 = time.perf_counter()
        own = asyncio.create_task(own_step())
        await asyncio.sleep(ARRIVES_AT * OWN_STEP_REAL_S)
        op = StageStepOp(pipeline="live-x", kind="hidden")
        conn = SimpleNamespace(send=send)
        await serving.op_stage_step(op, conn, memoryview(activation))  # type: ignore[arg-type]
        return (await own - t0) / d, (sent[0] - t0) / d

    return asyncio.run(run())


def test_a_live_batch_on_a_busy_partner_waits_for_its_step_in_both_bodies(
    tmp_path, monkeypatch
) -> None:
    cost, sim_own_s, sim_live_s = _sim_first_tokens(tmp_path)
    own_step_s = cost.prefill_s(OWN_TOKENS)
    live_s = cost.prefill_s(sum(LIVE_PROMPTS), NUM_LAYERS - SPLIT)
    # the simulator: the partner's step, then the live batch's S layers (not S layers after
    # it arrived)
    assert sim_own_s == pytest.approx(own_step_s)
    assert sim_live_s == pytest.approx(own_step_s + live_s)
    runtime_own_s, runtime_live_s = _runtime_first_tokens(cost, monkeypatch)
    assert runtime_own_s == pytest.approx(sim_own_s, rel=0.15)
    assert runtime_live_s == pytest.approx(sim_live_s, rel=0.15), (
        f"runtime {runtime_live_s:.6f} vs simulator {sim_live_s:.6f} emulated s "
        f"(arrival + S layers alone: {ARRIVES_AT * own_step_s + live_s:.6f})"
    )
