"""BlitzScale live scaling parity (§5.2 Eq. 1): what the partner's next step holds. A live
batch's last S layers are a step of their own on its partner, the live batches in the order
they reached it and before the partner's own requests
(`policy.blitzscale.live_step.next_step`): the simulator's engine takes a live batch alone
at its step boundary (`sim/batching.py` `Batcher._live_step`), the emulated agent's one GPU
gives a live batch's stage step (`runtime/node/serving.py`) its turn before the local
instance's next step from the moment the batch reaches the agent (`StepPacer.arrive`).

The scenario: the partner prefills its own request A; meanwhile live batch 1 (two prompts)
reaches it, then live batch 2, then its own request B. Both bodies: A, batch 1, batch 2, B,
each a step of its own. Before 2026-11-29 the simulator ran batches 1 and 2 and B in one
step after A (its engine's FIFO and token budget: their first tokens together), and the
runtime ran B before batch 2 (the GPU went to the local instance's step, waiting for it,
while batch 2 waited for batch 1's step to release their compute group): on the emulated
§6.1 7B run the partner prefilled request 15 (routed at 1.604 s) before batch 12-14's last
layers (docs/emulation.md).

The runtime side is real time: the pacer's time dilation makes A last about 1 s (on a
loaded box a step may start ~0.2 s late); the bodies agree within 15%."""

import asyncio
import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from surge.emulation import StepPacer
from surge.engine.batch import BatchMeta
from surge.engine.hidden import hidden_to_bytes
from surge.policy.blitzscale.live_step import OWN, next_step
from surge.policy.systems import system_config
from surge.runtime.node import instance_loop
from surge.runtime.node.context import step_pacer
from surge.runtime.node.serving import NO_CHARGES, AgentServing
from surge.runtime.protocol import StageOpenOp, StageStepOp
from surge.sim.costs import CostModel
from surge.sim.models import load_model
from surge.sim.request import SimRequest
from tests.parity.sim_world import busy_partner

NUM_LAYERS = 8
SYSTEM = replace(system_config("blitzscale"), pd_disaggregation=False, num_blocks=NUM_LAYERS)
SPLIT = 3
"""Layers the new instance ran (T); the partner runs the other S."""
OWN_A, OWN_B = 512, 256
"""The partner's own requests' prompts (every layer)."""
LIVE = {"live-1": (256, 256), "live-2": (128, 128)}
"""Each live batch's prompts, in the order they reach the partner."""
ARRIVES_AT = 0.25
"""When the live batches reach the partner, as a share of A's step."""
OWN_STEP_REAL_S = 1.0
"""What A's step lasts in real time (sets the time dilation)."""
ORDER = ("A", "live-1", "live-2", "B")


def test_a_live_batch_is_a_step_of_its_own_before_the_partners_own() -> None:
    """The policy: the first-arrived live batch alone, else the partner's own requests."""
    assert next_step([OWN, "b1", "b1", "b2", OWN]) == (1, 2)
    assert next_step([OWN, OWN]) == (0, 1)
    assert next_step([]) == ()


def _expected(cost: CostModel) -> dict[str, float]:
    """Each step's end when each runs alone in `ORDER`, from A's start (the cost model)."""
    steps = {
        "A": cost.prefill_s(OWN_A),
        "live-1": cost.prefill_s(sum(LIVE["live-1"]), NUM_LAYERS - SPLIT),
        "live-2": cost.prefill_s(sum(LIVE["live-2"]), NUM_LAYERS - SPLIT),
        "B": cost.prefill_s(OWN_B),
    }
    ends, t = {}, 0.0
    for name in ORDER:
        t += steps[name]
        ends[name] = t
    return ends


def _sim_first_tokens(tmp_path) -> tuple[CostModel, dict[str, float]]:
    """Each step's first tokens on the simulated partner, in simulated seconds."""
    partner, a = busy_partner(tmp_path, SYSTEM, NUM_LAYERS, OWN_A, 1, ARRIVES_AT)
    loop = partner.loop
    firsts: dict[str, SimRequest] = {"A": a}
    for key, (name, prompts) in enumerate(LIVE.items()):
        batch = [SimRequest(10 * (key + 1) + i, 0, 0.0, n, 1) for i, n in enumerate(prompts)]
        for r in batch:  # as `LiveScaling._target_done`'s activation arriving at the source
            r.skip_layers, r.live_batch = SPLIT, key
        partner.submit_many(batch)
        firsts[name] = batch[-1]
    b = SimRequest(99, 0, 0.0, OWN_B, 1)
    partner.submit_many([b])
    firsts["B"] = b
    loop.run(until_s=loop.now_s + 10.0)
    return partner.cost, {name: r.first_token_s for name, r in firsts.items()}


class _Runner:
    """A live stage's runner: no model, the batch's shape only (the pacer sets the time)."""

    arch = SimpleNamespace(num_layers=NUM_LAYERS)
    manifest = SimpleNamespace(digest="d")

    def run_layers(self, first: int, end: int, hidden: torch.Tensor, batch: BatchMeta):
        return hidden

    def logits(self, hidden: torch.Tensor, batch: BatchMeta) -> torch.Tensor:
        return torch.zeros(len(batch.q_lens), 4)


def _runtime_first_tokens(cost: CostModel, monkeypatch) -> dict[str, float]:
    """The same on one emulated agent: its local instance's steps (A, then B, asked for as
    soon as A is done) and the live batches' last stages (`op_stage_step`, one compute
    group), in emulated seconds (real / D) from A's start."""
    d = OWN_STEP_REAL_S / cost.prefill_s(OWN_A)
    pacer = StepPacer(load_model("llama2-7b"), "A100", d, turn=next_step)  # as the agent's
    pacer.cost = cost  # the simulator's cost model, as the pacer's own is the simulator's
    ctx = SimpleNamespace(pacer=pacer, node=0)
    own = [BatchMeta((0,), (0,), (OWN_A,)), BatchMeta((1,), (0,), (OWN_B,))]

    def step_and_park(inst, pace) -> tuple[list, dict]:
        inst.engine.last_batch = own.pop(0)
        pace()
        return [], {}

    monkeypatch.setattr(instance_loop, "step_and_park", step_and_park)
    inst = SimpleNamespace(engine=SimpleNamespace(arch=SimpleNamespace(num_layers=NUM_LAYERS)))
    store = SimpleNamespace(model=lambda name: SimpleNamespace(manifest=_Runner.manifest))
    serving = AgentServing(ctx, store)  # type: ignore[arg-type]
    serving._charges = lambda model: NO_CHARGES  # type: ignore[method-assign]
    serving._stage_runner = lambda model, first, end: _Runner()  # type: ignore[method-assign]
    ends: dict[str, float] = {}

    def engine(t0: float) -> None:  # the instance's loop: A, then B at once
        for name in ("A", "B"):
            instance_loop.paced_step(ctx, inst)  # type: ignore[arg-type]
            ends[name] = time.perf_counter() - t0

    async def live_step(name: str, t0: float) -> None:
        prompts = LIVE[name]
        batch = BatchMeta(tuple(range(len(prompts))), (0,) * len(prompts), prompts)
        activation = hidden_to_bytes(torch.zeros(len(prompts), max(prompts), 4), batch)

        async def send(header, payload, pace) -> None:
            ends[name] = time.perf_counter() - t0

        op = StageStepOp(pipeline=name, kind="hidden")
        conn = SimpleNamespace(send=send)
        await serving.op_stage_step(op, conn, memoryview(activation))  # type: ignore[arg-type]

    async def run() -> None:
        for name in LIVE:  # the live batches' last stages, one compute group
            op = StageOpenOp(name, "m", SPLIT, NUM_LAYERS, None, compute_group="live-m", digest="d")
            await serving.op_stage_open(op, None, memoryview(b""))  # type: ignore[arg-type]
        t0 = time.perf_counter()
        own_steps = asyncio.create_task(asyncio.to_thread(engine, t0))
        await asyncio.sleep(ARRIVES_AT * OWN_STEP_REAL_S)
        steps = []
        for name in LIVE:  # batch 1 reaches the partner, then batch 2
            steps.append(asyncio.create_task(live_step(name, t0)))
            await asyncio.sleep(0.01)
        await asyncio.gather(own_steps, *steps)

    asyncio.run(run())
    return {name: t / d for name, t in ends.items()}


def test_a_live_batch_runs_alone_and_first_on_its_partner_in_both_bodies(
    tmp_path, monkeypatch
) -> None:
    cost, sim = _sim_first_tokens(tmp_path)
    expected = _expected(cost)
    assert sorted(sim, key=sim.__getitem__) == list(ORDER), f"simulator {sim}"
    for name in ORDER:
        assert sim[name] == pytest.approx(expected[name]), (name, sim, expected)
    runtime = _runtime_first_tokens(cost, monkeypatch)
    assert sorted(runtime, key=runtime.__getitem__) == list(ORDER), f"runtime {runtime}"
    for name in ORDER:
        assert runtime[name] == pytest.approx(sim[name], rel=0.15), (name, runtime, sim)


def test_the_agents_pacer_takes_turns_by_the_policy() -> None:
    """An emulated agent's pacer (`step_pacer`) takes its GPU's turns by `next_step`."""
    config = SimpleNamespace(
        emulate="blitzscale-a-hosts:llama2-7b", emulated_gpu="A100", time_dilation=40.0
    )
    pacer = step_pacer(config)  # type: ignore[arg-type]
    assert pacer is not None and pacer._turn is next_step


def test_the_gpu_turn_goes_to_an_arrived_live_batch() -> None:
    """`StepPacer`'s turns (no pacing): a local step asked for while a live batch has
    arrived waits for that batch's step, which may come later."""
    pacer = StepPacer(load_model("llama2-7b"), "A100", 1.0, turn=next_step)
    order: list[str] = []
    pacer.arrive("live-1")

    def own() -> None:
        with pacer.step():
            order.append("own")

    t = threading.Thread(target=own)
    t.start()
    time.sleep(0.05)
    assert order == []  # waits for live-1, which has not asked yet
    with pacer.step("live-1"):
        order.append("live-1")
    t.join(5.0)
    assert order == ["live-1", "own"]
    pacer.arrive("live-2")
    pacer.leave("live-2")  # a live step that will not run frees the turn
    with pacer.step():
        order.append("own")
    assert order == ["live-1", "own", "own"]
