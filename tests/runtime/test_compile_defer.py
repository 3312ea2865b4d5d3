"""A node that serves steadily still compiles its decode graphs, after
`EngineConfig.compile_defer_max_s` (`policy/compile_gate.py`); a load, block transfer or
multicast in flight holds the compile however long (its harm was measured on transfers,
docs/engine.md). Before the bound, a node never quiet for `compile_quiet_s` decoded eager
for good."""

import asyncio
from pathlib import Path

from surge.config import EngineConfig
from surge.engine import compiled
from surge.policy.compile_gate import Activity, may_compile, observe
from surge.runtime.node.compile_quiet import CompileQuiet
from tests.runtime.test_compile_quiet import compile_agent, load_while_held, until


def test_serving_defers_a_compile_up_to_the_bound_and_a_transfer_for_good() -> None:
    quiet_s, defer_s = 2.0, 10.0

    def after(seen: list[tuple[float, bool, bool]]) -> tuple[Activity, float]:
        a = Activity()
        for now_s, holding, serving in seen:
            a = observe(a, now_s, holding, serving, quiet_s)
        return a, seen[-1][0]

    serving = [(float(t), False, True) for t in range(12)]
    assert not may_compile(*after(serving[:10]), quiet_s, defer_s)  # 9 s deferred
    assert may_compile(*after(serving[:11]), quiet_s, defer_s)  # 10 s: compile now
    holding = [(float(t), True, True) for t in range(100)]
    assert not may_compile(*after(holding), quiet_s, defer_s)
    # A transfer that ended restarts the bound from its end, after a quiet_s of no transfer.
    ended = [*holding[:5], *[(float(t), False, True) for t in range(5, 30)]]
    assert not may_compile(*after(ended[:6]), quiet_s, defer_s)
    assert not may_compile(*after(ended[:14]), quiet_s, defer_s)  # 9 s since it ended
    assert may_compile(*after(ended[:15]), quiet_s, defer_s)
    # A quiet spell starts a new stretch: the bound counts from its end.
    spell = [*serving[:8], (8.0, False, False), (10.5, False, False), (11.0, False, True)]
    assert not may_compile(*after(spell), quiet_s, defer_s)


def test_the_gate_opens_on_a_serving_node_after_the_bound() -> None:
    now, state = [0.0], [(False, True)]
    quiet = CompileQuiet(lambda: state[0], 2.0, 5.0, clock=lambda: now[0])
    assert not quiet.update()
    now[0] = 5.0
    assert quiet.update() and quiet.gate.is_set()
    quiet.touch()  # a transfer began: closed at once, and held while it runs
    state[0] = (True, True)
    for t in (6.0, 20.0, 100.0):
        now[0] = t
        assert not quiet.update() and not quiet.gate.is_set()


def test_an_agent_serving_steadily_compiles_after_the_bound_but_not_beside_a_transfer(
    registry: Path, manifest, tmp_path: Path, monkeypatch
) -> None:
    began: list[tuple[bool, bool]] = []  # (holding, serving) as each graph's compile began

    def recorded_compile(self, job) -> bool:  # stands for inductor
        began.append(agent.activity())
        return True

    monkeypatch.setattr(compiled.DecodeGraph, "_compile", recorded_compile)
    quiet_s, defer_s = 0.3, 1.0
    engine = EngineConfig(
        max_kv_tokens=512, compile_decode=True, compile_quiet_s=quiet_s, compile_defer_max_s=defer_s
    )
    agent = compile_agent(registry, tmp_path, engine)
    monkeypatch.setattr(agent.local, "busy", lambda: True)  # requests always in flight

    async def run() -> None:
        client, held, graph = await load_while_held(agent, manifest, began)
        try:
            await asyncio.sleep(quiet_s + 3 * defer_s)
            assert began == [] and graph.compiling  # the transfer holds it past the bound
            held.set_result(None)
            await until(lambda: not graph.compiling)
            assert began == [(False, True), (False, True)]  # serving all along
        finally:
            await client.close()
            await agent.close()

    asyncio.run(run())
