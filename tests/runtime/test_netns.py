"""The emulated cluster (`NetnsCluster`): agents in network namespaces behind one bridge,
links shaped by tc, a CPU quota each. Every test removes what it made; skipped where the
machine cannot make namespaces (not root, no iproute2, no cgroup CPU controller)."""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError
from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
from surge.runtime.launch import netns
from surge.runtime.launch.netns_cluster import NetnsCluster, require_netns
from surge.runtime.multicast import MulticastExecutor
from surge.runtime.protocol import AgentDown, ChecksumsOp, GenerateOp
from surge.runtime.transport import MIN_STALL_TIMEOUT_S, STALL_TIMEOUT_S
from tests.conftest import REPO
from tests.runtime.conftest import MODEL, connected, first_block_at, gone, needs_netns

PROMPT = [0, 5, 9, 200, 31]
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
CUT_S = 1.0
"""How long a passing fault lasts (a link down, an agent stopped): well under the agents'
stall bound (`STALL_TIMEOUT_S`, 8 s), so TCP's retransmissions ride it out and nothing fails
over. The rest of the work then takes 0.4-0.9 s after it ends (measured, 2 cores at load
12-18); a recovery that waited out a connection's stall bound and failed over shows as a
re-plan or a second hop, and a stuck one ends at the stall bound, not at a 60-s default."""


def multicast_then_generate(cluster: NetnsCluster, manifest, fault=None, dead: Sequence[int] = ()):
    """Multicast the model from node 0 to every other node's gpu tier (calling
    `fault(plan, client)` beside it if given; it awaits `first_block_at` its victim to strike
    mid-way), then generate on every receiver but those in `dead` (filled by the fault: nodes
    it cut off for good)."""
    n = cluster.config.num_nodes
    out = plan_scale_out(MulticastRequest(num_nodes=n, num_blocks=manifest.num_blocks))

    async def run():
        client = await connected(cluster, manifest)
        try:
            mc = MulticastExecutor(client, MODEL, out.plan, tier="gpu", timeout_s=60)
            task = asyncio.create_task(mc.run())
            if fault is not None:
                await fault(out.plan, client)
                assert not task.done(), (
                    "the multicast had ended before the fault: it tested nothing"
                )
            result = await asyncio.wait_for(task, 90)
            live = [v for v in range(n) if v not in dead]
            sums = {v: await client.call(v, ChecksumsOp(model=MODEL)) for v in live}
            ask = GenerateOp(model=MODEL, prompt_token_ids=tuple(PROMPT), params=PARAMS)
            tokens = await asyncio.gather(*(client.call(v, ask) for v in live if v != 0))
            return result, sums, [list(t.token_ids) for t in tokens]
        finally:
            await client.close()

    result, sums, tokens = asyncio.run(run())
    want = {b.index: b.checksum for b in manifest.blocks}
    assert result.complete_s is not None and result.dead_nodes == sorted(dead)
    assert all(s.checksums == want for s in sums.values()), "a node holds different bytes"
    want_tokens = LLMEngine(manifest).generate([PROMPT], PARAMS)[0].token_ids
    assert tokens == [want_tokens] * (n - 1 - len(dead))
    return result


@needs_netns
@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_a_shaped_three_node_cluster_multicasts_token_exact_at_the_tc_rate(
    make_netns, manifest
) -> None:
    gbps = 0.05
    cluster = make_netns(3, link_gbps=gbps, preload_engine=True)
    hosts = {host for host, _ in cluster.addresses.values()}
    assert len(hosts) == 3 and all(h.startswith("198.1") for h in hosts)
    for node in range(3):  # each agent runs in its node's cgroup, under its quota
        procs = netns.cpu_group(cluster.nets[node].netns, cluster.cores_per_node)
        assert str(cluster.procs[node].pid) in procs.read_text().split()
    result = multicast_then_generate(cluster, manifest)
    # Every receiver takes the whole model in through its own capped ingress: the kernel
    # rate bounds the multicast from below (the agents' own token buckets are off).
    floor_s = manifest.total_bytes * 8 / (gbps * 1e9)
    assert 0.95 * floor_s <= result.complete_s <= 2.5 * floor_s + 1.0, (result.complete_s, floor_s)


SINK = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
n = 0
while n < int(sys.argv[2]):
    n += len(c.recv(1 << 20))
c.sendall(b"k")
"""
SEND = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
t = time.monotonic()
c.sendall(bytes(int(sys.argv[3])))
c.recv(1)
print(time.monotonic() - t)
"""


def tcp_seconds(cluster: NetnsCluster, src: int, dst: int, num_bytes: int) -> float:
    """Seconds to send `num_bytes` over one TCP connection from node src to node dst."""

    def in_node(node: int, code: str, *args: object) -> subprocess.Popen:
        argv = [sys.executable, "-c", code, *map(str, args)]
        cmd = ["ip", "netns", "exec", cluster.nets[node].netns, *argv]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)

    sink = in_node(dst, SINK, cluster.nets[dst].address, num_bytes)
    try:
        port = int(sink.stdout.readline())
        send = in_node(src, SEND, cluster.nets[dst].address, port, num_bytes)
        out, _ = send.communicate(timeout=30)
        return float(out)
    finally:
        sink.kill()
        sink.wait(10)
        sink.stdout.close()


@needs_netns
@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_a_host_group_has_a_fast_link_of_its_own(make_netns) -> None:
    gbps, num_bytes = 0.05, 4_000_000
    cluster = make_netns(3, link_gbps=gbps, host_groups=((0, 1),), cpu_cores_per_node=0)
    floor_s = num_bytes * 8 / (gbps * 1e9)
    across = tcp_seconds(cluster, 0, 2, num_bytes)
    within = tcp_seconds(cluster, 0, 1, num_bytes)
    assert 0.85 * floor_s <= across <= 2 * floor_s, (across, floor_s)
    assert within < across / 5, (within, across)


@needs_netns
def test_a_link_down_mid_multicast_loses_nothing(make_netns, manifest) -> None:
    cluster = make_netns(4, link_gbps=0.05, preload_engine=True, cpu_cores_per_node=0)

    async def link_down(plan, client) -> None:
        victim = plan.steps[0][0].dst  # the first receiver forwards to others
        await first_block_at(client, victim)
        cluster.set_link(victim, up=False)
        await asyncio.sleep(CUT_S)
        cluster.set_link(victim, up=True)

    result = multicast_then_generate(cluster, manifest, link_down)
    assert result.replans == [], "a pull failed (a connection waited out its stall bound)"


@needs_netns
def test_a_node_frozen_mid_multicast_loses_nothing(make_netns, manifest) -> None:
    cluster = make_netns(4, link_gbps=0.05, preload_engine=True, cpu_cores_per_node=0)

    async def freeze(plan, client) -> None:
        pid = cluster.procs[plan.steps[0][0].dst].pid
        await first_block_at(client, plan.steps[0][0].dst)
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(CUT_S)
        os.kill(pid, signal.SIGCONT)

    result = multicast_then_generate(cluster, manifest, freeze)
    assert result.replans == [], "a pull failed (a connection waited out its stall bound)"


@needs_netns
def test_a_link_down_for_good_mid_multicast_is_noticed_and_the_rest_finish(
    make_netns, manifest
) -> None:
    """No 'up' again: the kernel's stall bound (the cluster's `stall_timeout_s`) fails every
    socket to the cut-off node, the controller marks it down and its dependants pull from other
    holders. The bound is the shortest allowed here, not the default's 8 s of waiting."""
    stall_s = MIN_STALL_TIMEOUT_S
    cluster = make_netns(
        4, link_gbps=0.05, preload_engine=True, cpu_cores_per_node=0, stall_timeout_s=stall_s
    )
    victim: list[int] = []
    cut_at: list[float] = []

    async def cut_for_good(plan, client) -> None:
        victim.append(plan.steps[0][0].dst)  # the first receiver forwards to others
        await first_block_at(client, victim[0])
        cut_at.append(time.time())
        cluster.set_link(victim[0], up=False)

    result = multicast_then_generate(cluster, manifest, cut_for_good, dead=victim)
    assert result.dead_nodes == victim
    assert any(r["instead_of"] == victim[0] for r in result.replans), result.replans
    # Noticed by the cluster's bound, not the default's (keepalive counts from the last
    # packet, up to a block's time before the cut: halfway between the two tells them apart).
    down_s = [ev.t - cut_at[0] for ev in result.events if isinstance(ev, AgentDown)]
    assert down_s and down_s[0] < (stall_s + STALL_TIMEOUT_S) / 2, down_s


@needs_netns
@pytest.mark.skipif(shutil.which("nft") is None, reason="packet loss needs nft (nftables)")
def test_five_percent_loss_on_one_link_during_a_scale_out_loses_nothing(
    make_netns, manifest
) -> None:
    cluster = make_netns(4, link_gbps=0.2, preload_engine=True, cpu_cores_per_node=0)

    lossy_node: list[int] = []

    async def lossy(plan, _client) -> None:
        lossy_node.append(plan.steps[0][0].dst)
        cluster.set_loss(lossy_node[0], 5.0)

    result = multicast_then_generate(cluster, manifest, lossy)
    assert netns.dropped_packets(cluster.nets[lossy_node[0]].netns) > 0, "nothing was dropped"
    assert not result.replans, "TCP should carry a 5% lossy link without giving up on it"


# Ctrl-C as a terminal delivers it. SIGINT is restored first: a shell starting a job in the
# background (`bash .ci/run &`) ignores SIGINT for it, children inherit that, and Python then
# installs no KeyboardInterrupt handler.
LAUNCHER = """
import json, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from surge.runtime.launch.netns_cluster import NetnsCluster, NetnsClusterConfig
with NetnsCluster(NetnsClusterConfig(num_nodes=2, link_gbps=0.1, preload_engine=False)) as c:
    pids = [p.pid for p in c.procs.values()]
    print(json.dumps({"prefix": c.prefix, "pids": pids, "work_dir": str(c.work_dir)}), flush=True)
    time.sleep(120)
"""


def start_launcher() -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        started = json.loads(proc.stdout.readline())
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    assert netns.resources(started["prefix"]), "the launcher had made nothing"
    return proc, started


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return all(gone(pid) for pid in pids)


@needs_netns
def test_ctrl_c_removes_everything() -> None:
    proc, started = start_launcher()
    proc.send_signal(signal.SIGINT)  # KeyboardInterrupt in the launcher: its `with` stops
    proc.wait(60)  # 3.4 s on a quiet 2-core VM
    proc.stdout.close()
    assert netns.resources(started["prefix"]) == [], "Ctrl-C left namespaces, links or cgroups"
    assert not Path(started["work_dir"]).exists(), "Ctrl-C left the work dir"
    assert wait_gone(started["pids"], 1.0), "an agent outlived Ctrl-C"


@needs_netns
def test_what_a_killed_launcher_left_is_swept_by_the_next(make_netns) -> None:
    proc, started = start_launcher()
    proc.kill()  # SIGKILL: no cleanup runs in the launcher
    proc.wait(10)
    proc.stdout.close()
    assert netns.resources(started["prefix"]), "nothing to sweep: the test proves nothing"
    assert Path(started["work_dir"], "node1").is_dir(), "no work dir to sweep"
    make_netns(1)  # a new launcher sweeps at start
    assert netns.resources(started["prefix"]) == []
    assert not Path(started["work_dir"]).exists(), "the killed launcher's work dir is left"
    assert wait_gone(started["pids"]), "an orphaned agent survived the sweep"


def test_a_missing_requirement_is_one_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None)
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(SurgeError, match=r"needs root .*`ip` \(apt-get install iproute2\)"):
        require_netns()


@needs_netns
@pytest.mark.parametrize("fault", ["link_down", "sigstop"])
def test_a_pipeline_member_cut_off_mid_generation_loses_nothing(
    fault, make_netns, manifest, tiny_hf
) -> None:
    from surge.runtime.endpoints import LocalEndpoint
    from surge.runtime.pipeline_endpoint import PipelineEndpoint
    from surge.runtime.server import Server
    from tests.runtime.test_serving import PROMPTS, check_against_reference, ready_cluster

    cluster = make_netns(3, link_gbps=0.5, preload_engine=True, cpu_cores_per_node=0)
    params = SamplingParams(max_tokens=40, ignore_eos=True)

    async def cut(node: int, off: bool) -> None:
        if fault == "link_down":
            cluster.set_link(node, up=not off)
        else:
            os.kill(cluster.procs[node].pid, signal.SIGSTOP if off else signal.SIGCONT)

    async def run():
        client = await ready_cluster(cluster, manifest)
        server = Server(client, MODEL)
        try:
            local = LocalEndpoint(client, 0, MODEL, "local-0")
            await local.open()
            ep = PipelineEndpoint(client, manifest, MODEL, "p", [(1, 0, 2), (2, 2, 4)])
            await ep.open()
            await server.add_endpoint(ep)
            reqs = [server.new_request(p, params) for p in PROMPTS]
            for r in reqs:
                await server.submit(r)
            while min(len(r.output_token_ids) for r in reqs) < 5:
                await asyncio.sleep(0.01)
            await server.add_endpoint(local)  # where a retired pipeline's requests would go
            await cut(2, off=True)
            cut_off = [r.req_id for r in reqs if not r.done.is_set()]
            await asyncio.sleep(CUT_S)
            await cut(2, off=False)
            try:  # before any connection's stall bound could have failed it (CUT_S)
                await server.wait_all(STALL_TIMEOUT_S)
            except TimeoutError:
                left = {r.req_id: len(r.output_token_ids) for r in reqs if not r.done.is_set()}
                msg = f"not done {STALL_TIMEOUT_S:g} s after the cut: {left}"
                raise AssertionError(msg) from None
            return reqs, cut_off
        finally:
            await server.close()
            await client.close()

    reqs, cut_off = asyncio.run(run())
    assert cut_off, "every request had finished before the fault: it tested nothing"
    # ridden out by TCP on the pipeline's own connections, not failed over to local-0
    assert all(r.hops == ["p"] for r in reqs), [r.hops for r in reqs]
    check_against_reference(tiny_hf, reqs, 40)
