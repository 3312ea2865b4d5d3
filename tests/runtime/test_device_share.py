"""Agents of one host group share one device copy (`open_mate_copy`, IPC handles), on the
fake GPU whose arenas are files in /dev/shm: the mate that opens the copy makes no arena of
its own and generates the reference's tokens from the owner's memory; an agent outside
the group is refused; the parameter pool drops a mapped copy with its owner. A scale-out
chooses the share by itself (`policy.copies.mate_copies`): its destination in the owner's host
group opens the copy, one outside it loads its own."""

import asyncio
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from surge.config import EngineConfig
from surge.control.pool import ParameterPool
from surge.control.scaleouts import device_owners
from surge.engine.devmem.fake import ARENA_DIR, ARENA_PREFIX
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError
from surge.policy.copies.mate_copies import MateOpen
from surge.policy.startup import Copy, Destination
from surge.policy.systems import system_config
from surge.runtime.launch.agent_process import agent_argv
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.protocol import (
    BlockArrived,
    GenerateOp,
    LinkReport,
    LoadOp,
    OpenMateCopyOp,
    SetPeersOp,
    StatusOp,
)
from surge.runtime.scaleout import ControllerHooks, ScaleOutContext, run_scale_out
from surge.runtime.server import Server
from surge.runtime.transport import RemoteError
from tests.engine.reference import assert_same_tokens, hf_greedy
from tests.runtime.conftest import MODEL, connected
from tests.runtime.test_serving import PROMPTS, check_against_reference

PROMPT = [0, 5, 9, 200, 31]


def arenas_of(pid: int) -> list[Path]:
    return sorted(ARENA_DIR.glob(f"{ARENA_PREFIX}{pid}_*"))


def test_a_host_group_shares_one_device_copy(make_cluster, manifest, tiny_hf) -> None:
    cluster = make_cluster(3, host_groups=((0, 1),), device="fake")
    blocks = tuple(range(manifest.num_blocks))
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    ref, logits = hf_greedy(tiny_hf, PROMPT, 12)
    pids = {n: p.pid for n, p in cluster.procs.items()}

    async def run() -> None:
        client = await connected(cluster, manifest, {0: list(blocks)}, tier="gpu")
        try:
            assert len(arenas_of(pids[0])) == len(blocks)  # the owner's one device copy
            q = client.subscribe((BlockArrived,), model=MODEL)
            await client.call(1, OpenMateCopyOp(model=MODEL, blocks=blocks, mate=0))
            got = [q.get_nowait() for _ in range(q.qsize())]
            shared = [e for e in got if e.node == 1 and e.tier == "gpu"]
            assert [e.block for e in shared] == list(blocks)
            assert all(e.source == "mate" and e.src == 0 for e in shared)
            assert arenas_of(pids[1]) == [], "the mate copied instead of sharing"
            status = await client.call(1, StatusOp())
            assert status.models[MODEL].gpu == blocks
            for node in (0, 1):
                reply = await client.call(
                    node, GenerateOp(model=MODEL, prompt_token_ids=tuple(PROMPT), params=params)
                )
                assert_same_tokens(list(reply.token_ids), ref, logits, f"node {node}")
            with pytest.raises(RemoteError, match="not a host mate"):
                await client.call(2, OpenMateCopyOp(model=MODEL, blocks=blocks, mate=0))
            with pytest.raises(SurgeError, match="a mate's device copy is open_mate_copy"):
                LoadOp(model=MODEL, blocks=blocks, source="mate")
        finally:
            await client.close()

    asyncio.run(run())
    cluster.stop()
    assert not any(arenas_of(pid) for pid in pids.values()), (
        "a fake device arena outlived its agent"
    )


def test_a_scale_out_opens_the_host_groups_copy_by_itself(make_cluster, manifest, tiny_hf) -> None:
    cluster = make_cluster(3, host_groups=((0, 1),), device="fake")
    blocks = tuple(range(manifest.num_blocks))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    pids = {n: p.pid for n, p in cluster.procs.items()}
    opened: list[int] = []

    async def on_local(node: int, ep) -> None:
        opened.append(node)

    async def run():
        client = await connected(cluster, manifest, {0: list(blocks)}, tier="gpu")
        server = Server(client, MODEL)
        try:
            hello = await client.broadcast(SetPeersOp(peers=dict(cluster.addresses)))
            links = {n: LinkReport.planned(r.links) for n, r in hello.items()}
            assert all(links[n].shares_device for n in range(3))  # the fake GPU shares
            q = client.subscribe((BlockArrived,), model=MODEL)
            ctx = ScaleOutContext(
                client,
                server,
                manifest,
                replace(system_config("blitzscale"), num_blocks=manifest.num_blocks),
                (Destination(1), Destination(2)),
                ControllerHooks(on_local=on_local),
                copies=(Copy(0, "gpu"),),
                engine=EngineConfig(max_num_seqs=4),
                links=links,
                device_owners=(0,),
            )
            kind = await run_scale_out(ctx)
            reqs = [server.new_request(p, params) for p in PROMPTS]
            for r in reqs:
                await server.submit(r)
            await server.wait_all(60)
            got = [q.get_nowait() for _ in range(q.qsize())]
            return kind, ctx.report, reqs, got
        finally:
            await server.close()
            await client.close()

    kind, report, reqs, got = asyncio.run(run())
    assert kind == "hot" and report.mate_opens == (MateOpen(1, 0),)
    assert sorted(opened) == [1, 2]
    to_1 = {(e.source, e.src) for e in got if e.node == 1 and e.tier == "gpu"}
    assert to_1 == {("mate", 0)}, "node 1 loaded instead of opening its mate's copy"
    assert arenas_of(pids[1]) == [], "the mate copied instead of sharing"
    assert len(arenas_of(pids[2])) == len(blocks)  # outside the group: a copy of its own
    assert {e.source for e in got if e.node == 2} != {"mate"}
    check_against_reference(tiny_hf, reqs, 6)


def test_the_controller_offers_only_own_device_copies() -> None:
    pool = ParameterPool()
    pool.add_model("m", 2)
    pool.add("m", 0, "gpu", (0, 1))
    pool.add_shared("m", 1, 0, (0, 1))
    pool.add("m", 3, "gpu", (0,))  # not complete
    assert device_owners(pool, "m", {0, 1, 3}) == (0,)
    assert device_owners(pool, "m", {1, 3}) == ()  # the owner is down


def test_the_pool_drops_a_mapped_copy_with_its_owner() -> None:
    pool = ParameterPool()
    pool.add_model("m", 2)
    pool.add("m", 0, "gpu", (0, 1))
    pool.add_shared("m", 1, 0, (0, 1))
    pool.add("m", 2, "gpu", (0, 1))
    assert pool.complete("m", "gpu") == [0, 1, 2]
    pool.drop_node(0)
    assert pool.complete("m", "gpu") == [2]  # node 1's copy was node 0's memory
    assert pool.shared_from["m"] == {}


def test_node_run_refuses_an_unknown_device_with_one_error_line(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "surge.cli", "node", "run", "--node-id", "0"]
    argv += ["--disk-dir", str(tmp_path), "--device", "tpu"]
    env = {**os.environ, "SURGE_TOKEN": "t" * 32}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: device 'tpu' is not auto, cpu or cuda[:N]"]


def test_launchers_pass_the_device_on(tmp_path: Path) -> None:
    config = LocalCluster(LocalClusterConfig(num_nodes=1, device="fake")).agent_config(0)
    argv = agent_argv(config)
    assert argv[argv.index("--device") + 1] == "fake"
    assert "--device" not in agent_argv(replace(config, engine=EngineConfig()))
