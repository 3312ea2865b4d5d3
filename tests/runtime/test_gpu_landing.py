"""Blocks reach the gpu tier through the device seam, on a fake GPU (agents in this process,
so the test holds each agent's `FakeMemory` and decides when its copies complete):
- a block is announced in the gpu tier (its `arrival` event, `status`) only after its copy
  event completed, and is copied once, contiguously, from pinned memory;
- the host tier's segments are pinned once (a second warm start pins nothing new);
- a multicast receiver takes block i+1 off the network while block i's copy is in flight;
- the tokens are the reference's (transformers), as without the seam."""

import asyncio
import contextlib
import secrets
import time
from pathlib import Path

from surge.config import EngineConfig
from surge.engine.devmem.fake import FakeMemory
from surge.engine.sampling import SamplingParams
from surge.runtime.client import ClusterClient
from surge.runtime.node.agent import NodeAgent
from surge.runtime.node.context import AgentConfig
from surge.runtime.protocol import (
    BlockArrived,
    EvictOp,
    GenerateOp,
    LoadOp,
    MulticastOp,
    ReceiveDone,
    RegisterOp,
    SetPeersOp,
)
from tests.engine.reference import assert_same_tokens, hf_greedy
from tests.runtime.conftest import MODEL

PROMPT = [0, 5, 9, 200, 31]


@contextlib.asynccontextmanager
async def agents_in_process(registry: Path, tmp_path: Path, manifest, memories):
    """Agents in this event loop, one per fake device; the model registered on each."""
    token, cluster_id = secrets.token_hex(16), secrets.token_hex(3)
    agents = []
    client = None
    try:
        for node, memory in enumerate(memories):
            config = AgentConfig(
                node=node,
                cluster_id=cluster_id,
                token=token,
                disk_dir=tmp_path / f"disk{node}",
                remote_dir=registry,
                preload_engine=False,
                engine=EngineConfig(max_kv_tokens=512),
            )
            agent = NodeAgent(config, memory=memory)
            await agent.start()
            agents.append(agent)
        addresses = {a.node: ("127.0.0.1", a.port) for a in agents}
        client = ClusterClient(addresses, token)
        await client.connect()
        await client.broadcast(SetPeersOp(peers=addresses))
        await client.broadcast(RegisterOp(model=MODEL, manifest=manifest))
        yield agents, client
    finally:
        for memory in memories:
            memory.release_all()  # nothing left waiting on a copy
        if client is not None:
            await client.close()
        for agent in agents:
            await agent.close()
    assert not list(Path("/dev/shm").glob(f"surge_{cluster_id}_*")), "shared memory leaked"


async def until(cond, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


async def gpu_arrivals(q: asyncio.Queue, node: int, settle_s: float = 0.0) -> list[int]:
    """Blocks announced in `node`'s gpu tier so far (waiting `settle_s` for stragglers)."""
    if settle_s:
        await asyncio.sleep(settle_s)
    out = []
    while not q.empty():
        ev = q.get_nowait()
        if isinstance(ev, BlockArrived) and ev.node == node and ev.tier == "gpu":
            out.append(ev.block)
    return out


def gpu_held(agent: NodeAgent) -> tuple[int, ...]:
    """The gpu tier as `status` reports it (read in-process: the control connection is busy
    with the load)."""
    return agent.store.holdings()[MODEL].gpu


async def check_tokens(client: ClusterClient, node: int, tiny_hf: Path) -> None:
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    reply = await client.call(
        node, GenerateOp(model=MODEL, prompt_token_ids=tuple(PROMPT), params=params)
    )
    ref, logits = hf_greedy(tiny_hf, PROMPT, 12)
    assert_same_tokens(list(reply.token_ids), ref, logits, f"node {node} via the fake GPU")


def test_warm_start_announces_each_block_after_its_copy_and_pins_once(
    registry, manifest, tiny_hf, tmp_path
) -> None:
    fake = FakeMemory(gated=True)
    blocks = tuple(range(manifest.num_blocks))

    async def run() -> None:
        async with agents_in_process(registry, tmp_path, manifest, [fake]) as (agents, client):
            await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="host"))
            assert fake.registrations == manifest.num_blocks  # each segment pinned as it landed
            q = client.subscribe((BlockArrived,), model=MODEL)
            load = asyncio.create_task(
                client.call(0, LoadOp(model=MODEL, blocks=blocks, source="host", tier="gpu"))
            )
            for k in blocks:
                await until(lambda k=k: len(fake.copies) == k + 1)
                assert await gpu_arrivals(q, 0, settle_s=0.2) == [], f"block {k} before its copy"
                assert gpu_held(agents[0]) == blocks[:k]
                fake.release(1)
                await until(lambda: not q.empty())
                assert await gpu_arrivals(q, 0) == [k]
            await load
            assert [c.num_bytes for c in fake.copies] == [b.size_bytes for b in manifest.blocks]
            assert all(c.kind == "h2d" and c.pinned for c in fake.copies)
            await check_tokens(client, 0, tiny_hf)
            # A second warm start copies again from the same, already pinned, segments.
            await client.call(0, EvictOp(model=MODEL, blocks=blocks, tier="gpu"))
            assert gpu_held(agents[0]) == ()
            fake.release_all()
            await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="host", tier="gpu"))
            assert len(fake.copies) == 2 * len(blocks) and all(c.pinned for c in fake.copies)
            assert fake.registrations == manifest.num_blocks
            await check_tokens(client, 0, tiny_hf)

    asyncio.run(run())


def test_a_receiver_takes_the_next_block_while_the_last_one_copies(
    registry, manifest, tiny_hf, tmp_path
) -> None:
    sender, receiver = FakeMemory(), FakeMemory(gated=True)
    blocks = tuple(range(manifest.num_blocks))
    sizes = [b.size_bytes for b in manifest.blocks]

    async def run() -> None:
        async with agents_in_process(registry, tmp_path, manifest, [sender, receiver]) as (
            agents,
            client,
        ):
            await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="host"))
            q = client.subscribe((BlockArrived,), model=MODEL)
            done = client.subscribe((ReceiveDone,), model=MODEL)
            recv = tuple((step, b, 0) for step, b in enumerate(blocks))
            await client.call(1, MulticastOp(mc_id="m", model=MODEL, recv=recv, tier="gpu"))
            transfer = agents[1].transfer
            for k in blocks:
                await until(lambda k=k: len(receiver.copies) == k + 1)
                # Block k is on its way to the device; block k+1 comes off the network meanwhile.
                nxt = min(k + 2, len(blocks))
                await until(lambda nxt=nxt: transfer.bytes_in == sum(sizes[:nxt]))
                assert receiver.pending() == 1 and k not in receiver.done_s
                assert await gpu_arrivals(q, 1, settle_s=0.1) == [], f"block {k} before its copy"
                receiver.release(1)
                await until(lambda: not q.empty())
                assert await gpu_arrivals(q, 1) == [k]
            await asyncio.wait_for(done.get(), 30)
            assert [c.num_bytes for c in receiver.copies] == sizes
            assert all(c.pinned for c in receiver.copies), "received into pageable memory"
            assert gpu_held(agents[1]) == blocks
            await check_tokens(client, 1, tiny_hf)

    asyncio.run(run())
