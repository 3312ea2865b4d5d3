"""A node's engines compile their decode graphs only while the node is quiet
(`runtime/node/compile_quiet.py`, `policy/compile_gate.py`): the compile ran dynamo and
inductor beside the agent's event loop, holding the GIL, and a hot scale-out took 7.7 s
instead of 2.0 s (docs/engine.md).
- the gate follows the node: closed while anything is in flight and for `quiet_s` after;
- an agent whose model has landed but which still has work about it in flight does not
  begin the compile its runner asked for at the last block; it begins once the node has been
  quiet for `compile_quiet_s`, with nothing in flight."""

import asyncio
import secrets
import time
from pathlib import Path

from surge.config import EngineConfig
from surge.engine import compiled
from surge.policy.compile_gate import Activity, may_compile, observe
from surge.runtime.client import ClusterClient
from surge.runtime.node.agent import NodeAgent
from surge.runtime.node.compile_quiet import CompileQuiet
from surge.runtime.node.context import AgentConfig
from surge.runtime.protocol import LoadOp, RegisterOp
from tests.runtime.conftest import MODEL


async def until(cond, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


def test_may_compile_after_a_quiet_spell() -> None:
    def seen(now_s: float, holding: bool, before: Activity | None = None) -> bool:
        a = observe(before or Activity(), now_s, holding, False, 2.0)
        return may_compile(a, now_s, 2.0, defer_max_s=60.0)

    assert seen(10.0, False)  # never busy: a warm node before requests
    assert not seen(10.0, True)
    busy_at_9 = observe(Activity(), 9.0, True, False, 2.0)
    assert not seen(10.0, False, busy_at_9)
    assert seen(11.0, False, busy_at_9)
    assert not may_compile(observe(Activity(), 9.0, True, False, 0.0), 9.0, 0.0, 60.0)


def test_the_gate_follows_the_node() -> None:
    now, busy = [0.0], [False]
    quiet = CompileQuiet(lambda: (busy[0], False), 2.0, 60.0, clock=lambda: now[0])
    assert quiet.update() and quiet.gate.is_set()
    busy[0] = True
    assert not quiet.update() and not quiet.gate.is_set()
    busy[0], now[0] = False, 1.5
    assert not quiet.update() and not quiet.gate.is_set()  # quiet, not for long enough
    now[0] = 2.0
    assert quiet.update() and quiet.gate.is_set()
    quiet.touch()  # an op began: closed at once, not at the next poll
    assert not quiet.gate.is_set()
    now[0] = 3.0
    assert not quiet.update()  # quiet for 1 s only since the op began


def compile_agent(registry: Path, tmp_path: Path, engine: EngineConfig) -> NodeAgent:
    """An in-process agent whose engines compile decode graphs (`engine`)."""
    return NodeAgent(
        AgentConfig(
            node=0,
            cluster_id=secrets.token_hex(3),
            token=secrets.token_hex(16),
            disk_dir=tmp_path / "disk0",
            remote_dir=registry,
            preload_engine=False,
            engine=engine,
        )
    )


async def load_while_held(agent: NodeAgent, manifest, began: list) -> tuple:
    """Start `agent` and load the model into it while work about the model is left running
    (as a multicast's pulls: a transfer in flight); (client, the held work's future, the
    model's decode graph once its compile thread waits at the gate or has begun)."""
    await agent.start()
    client = ClusterClient({0: ("127.0.0.1", agent.port)}, agent.config.token)
    try:
        await client.connect()
        await client.call(0, RegisterOp(model=MODEL, manifest=manifest))
        held = asyncio.get_running_loop().create_future()
        agent.ctx.inflight.track(MODEL, asyncio.ensure_future(held))
        blocks = tuple(range(manifest.num_blocks))
        await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="gpu"))
        graph = agent.store.model(MODEL).runner.decode_graph
        assert graph is not None  # asked for its graphs at the last block, and waits:
        await until(lambda: graph.num_gate_waits == 1 or began != [])
    except BaseException:
        await client.close()
        await agent.close()
        raise
    return client, held, graph


def test_an_agent_compiles_only_after_its_blocks_landed_and_it_was_quiet(
    registry: Path, manifest, tmp_path: Path, monkeypatch
) -> None:
    began: list[bool] = []  # as each graph's compile began: was anything in flight?

    def recorded_compile(self, job) -> bool:  # stands for inductor (minutes on a busy box)
        began.append(any(agent.activity()))
        return True

    monkeypatch.setattr(compiled.DecodeGraph, "_compile", recorded_compile)
    quiet_s = 1.0
    engine = EngineConfig(max_kv_tokens=512, compile_decode=True, compile_quiet_s=quiet_s)
    agent = compile_agent(registry, tmp_path, engine)

    async def run() -> None:
        client, held, graph = await load_while_held(agent, manifest, began)
        try:
            await asyncio.sleep(2 * quiet_s)
            assert began == [] and graph.compiling  # nothing began while the node was busy
            held.set_result(None)
            await until(lambda: not graph.compiling)
            assert began == [False, False]  # batch 1, batches >= 2: each on a quiet node
        finally:
            await client.close()
            await agent.close()

    asyncio.run(run())
