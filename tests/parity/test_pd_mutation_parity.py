"""BlitzScale §5.2 mutation parity: when it takes effect. The simulator's mutation
(`sim/pd.py` `PdPool._mutate`) turns the instance into a decode one at the monitor's look:
the look goes on (`with_monitor`, a scale-out's `scale_out_mutations`) with the deployment
as it is at that instant, and the instance's prefill step under way ends in the decode
role, so that step's requests decode where they were prefilled (`sim/batching.py`
`_on_prefill` reads the role as the step ends). The runtime's agent must answer
`instance_role` at once and end the step under way in the new role
(`runtime/node/pd.py` `op_instance_role`, `step_and_park`).

Before 2026-11-29 the agent applied the role between two steps: `instance_role` waited for
the step under way, and the controller's autoscaler tick with it (`control/pd.py`
`PdControl._mutate` awaits it). On the emulated §6.1 7B run the mutation of node 2 decided at
2.20 s took effect at 2.511, after node 2's 0.43-s prefill step of requests 25-28 (which
parked, as a prefill instance's). The look's wish for a prefill instance to compensate the
mutation was then weighed against the deployment of 2.511, where node 3 had come up
(2.431): every instance serving, the runtime scaled out node 4 and mutated node 3 for it,
leaving node 0 the one prefill instance for requests 33-63 (mean TTFT 0.315 s, simulator
0.147). The simulator weighed it at 2.2, node 3 still loading, and started nothing
(docs/emulation.md)."""

import asyncio
import contextlib
import threading
from types import SimpleNamespace

import torch

from surge.engine.llm_engine import TokenEvent
from surge.policy.blitzscale.pd import DECODE, PREFILL
from surge.policy.systems import system_config
from surge.runtime.node import instance_loop
from surge.runtime.node.local_instance import LocalInstance
from surge.runtime.node.pd import AgentPd
from surge.runtime.protocol import InstanceRoleOp
from surge.sim.request import SimRequest
from tests.parity.sim_world import instance_on, simulation

PROMPT_TOKENS = 64
SEQ_ID = 7
ANSWER_WITHIN_S = 1.0
"""How long the agent may take to answer `instance_role` while its step runs (the step
lasts until the test ends it)."""


def _sim_parked(tmp_path, mutate: bool) -> tuple[bool, float, float]:
    """A prefill instance (node 0, a decode one on node 1) prefills one request; with
    `mutate`, it turns decode halfway through the step (`PdPool._mutate` sets the role).
    Whether the request parked for a decode instance, its first token's time and the
    mutation's."""
    tmp_path.mkdir()
    sim = simulation(tmp_path, system_config("blitzscale"), 2, "registry", gpu_speedup=0.01)
    prefill = instance_on(sim, 0, serving=True)
    prefill.role = PREFILL
    instance_on(sim, 1, serving=True).role = DECODE
    req = SimRequest(0, 0, 0.0, PROMPT_TOKENS, 4)
    loop = sim.world.loop
    step_s = prefill.cost.prefill_s(PROMPT_TOKENS)
    prefill.submit(req)
    mutated_s = loop.now_s + step_s / 2
    loop.run(until_s=mutated_s)
    assert req.first_token_s < 0, "the step must still be under way"
    if mutate:
        prefill.role = DECODE
    loop.run(until_s=mutated_s + 10 * step_s)
    return req.parked_s >= 0, req.first_token_s, mutated_s


class _Pacer:
    """The emulated GPU (`StepPacer`): the step lasts until the test ends it."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.end = threading.Event()

    @contextlib.contextmanager
    def step(self):
        yield 0.0

    def pace(self, started_s: float, *shape) -> None:
        self.running.set()
        self.end.wait(10.0)


def _engine() -> SimpleNamespace:
    """One sequence whose prefill the step finishes; what parking reads, were it parked."""
    runner = SimpleNamespace(
        export_kv=lambda sid, n: torch.zeros(2, 2),
        first_layer=0,
        end_layer=2,
        manifest=SimpleNamespace(digest="d"),
    )
    return SimpleNamespace(
        step=lambda: [TokenEvent(SEQ_ID, 1, False, None)],
        last_batch=SimpleNamespace(q_lens=(PROMPT_TOKENS,)),
        arch=SimpleNamespace(num_layers=2),
        seqs={SEQ_ID: SimpleNamespace(num_cached=PROMPT_TOKENS, output_token_ids=[1])},
        executor=SimpleNamespace(runner=runner),
        abort=lambda sid: None,
    )


def _runtime_mutated_mid_step() -> tuple[bool, dict[int, str], dict[int, str]]:
    """The runtime's agent: a prefill instance's step under way (paced), `instance_role`
    to decode arrives. Whether it answered before the step ended; the step's parked
    requests; the requests the instance still holds."""
    pacer = _Pacer()
    ctx = SimpleNamespace(pacer=pacer, node=2)
    inst = LocalInstance("m-node2", "m", _engine(), role=PREFILL)  # type: ignore[arg-type]
    inst.requests[SEQ_ID] = "r7"
    inst.fresh.add(SEQ_ID)
    agent = AgentPd({inst.name: inst}, lambda model: 1.0)

    async def run() -> tuple[bool, dict[int, str], dict[int, str]]:
        step = asyncio.ensure_future(asyncio.to_thread(instance_loop.paced_step, ctx, inst))  # type: ignore[arg-type]
        assert await asyncio.to_thread(pacer.running.wait, 10.0), "the step never started"
        op = InstanceRoleOp(instance=inst.name, role=DECODE)
        try:
            await asyncio.wait_for(
                agent.op_instance_role(op, None, memoryview(b"")),  # type: ignore[arg-type]
                ANSWER_WITHIN_S,
            )
            answered = True
        except TimeoutError:
            answered = False
        pacer.end.set()
        _, parked = await step
        return answered, parked, dict(inst.requests)

    return asyncio.run(run())


def test_a_mutation_applies_at_once_and_the_step_under_way_ends_in_the_decode_role(
    tmp_path,
) -> None:
    # the simulator: unmutated, the request parks for a decode instance; mutated halfway
    # through the step, it decodes where it was prefilled (no hand-off), the step not cut
    parked, first_s, _ = _sim_parked(tmp_path / "a", mutate=False)
    assert parked
    parked_mutated, first_mutated_s, mutated_s = _sim_parked(tmp_path / "b", mutate=True)
    assert not parked_mutated
    assert first_mutated_s == first_s > mutated_s
    # the runtime: the agent answers while the step runs (the controller's look is not
    # held over it), and the step's prefill ends in the decode role: nothing parked, the
    # request stays on the instance to decode
    answered, runtime_parked, held = _runtime_mutated_mid_step()
    assert answered, "instance_role waited for the step under way"
    assert runtime_parked == {}
    assert held == {SEQ_ID: "r7"}
