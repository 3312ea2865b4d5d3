"""Byte scaling: every rate of an emulated agent is the preset's rate times real store bytes /
emulated model bytes, over D, so the real store moves in D times the emulated model's time;
the agents, host groups and KV capacity follow the preset."""

from pathlib import Path

import pytest

from surge.emulation import ByteScale, Emulation, EmulationConfig
from surge.errors import SurgeError
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.sim.models import load_model

GB = 1e9


def emulation(
    spec: str = "lambdascale-testbed1:llama2-13b", d: float = 10.0, real: int = 8_000_000
):
    return Emulation(EmulationConfig.parse(spec, d), real, real_kv_bytes_per_token=4096)


def seconds(num_bytes: float, gbps: float) -> float:
    return num_bytes / (gbps * GB / 8)


def test_the_real_store_moves_in_d_times_the_emulated_models_time() -> None:
    e = emulation(d=10.0)
    em_bytes = load_model("llama2-13b").total_bytes
    for gbps in (400.0, 40.0, 512.0):  # NIC, SSD, PCIe of Testbed1
        emulated_s = seconds(em_bytes, gbps)
        assert seconds(8_000_000, e.scale.gbps(gbps)) == pytest.approx(10.0 * emulated_s)
    assert e.scale == ByteScale(8_000_000 / em_bytes, 10.0)
    with pytest.raises(SurgeError):
        ByteScale(0.0, 1.0)


def test_nodes_follow_the_preset_one_agent_per_gpu() -> None:
    e = emulation("lambdascale-testbed2:llama2-13b")  # 6 machines x 4 H800, 400 Gb/s NIC each
    nodes = e.nodes(6)
    assert [n.machine for n in nodes] == [0, 0, 0, 0, 1, 1]
    assert e.host_groups(nodes) == ((0, 1, 2, 3), (4, 5))
    assert nodes[0].nic_gbps == 100.0  # the machine's NIC split over its 4 GPUs
    assert nodes[0].host_gbps == 3200.0 and nodes[0].gpu == "H800"
    alone = emulation().nodes(3)  # Testbed1: one GPU per machine
    assert emulation().host_groups(alone) == () and alone[2].host_gbps is None
    assert len(emulation().nodes()) == 12
    with pytest.raises(SurgeError, match="has 12 GPUs"):
        emulation().nodes(13)
    with pytest.raises(SurgeError, match="does not fit one A10"):
        emulation("paraserve-1:llama2-70b").nodes(1)


def test_kv_capacity_is_the_emulated_gpus_clipped_to_the_budget() -> None:
    model = load_model("llama2-13b")
    e = emulation()
    node = e.nodes(1)[0]
    free = 80 * 2**30 - model.total_bytes  # an "80 GB" H800 holds 80 GiB
    assert e.emulated_kv_tokens(node) == int(free // model.kv_bytes_per_token)
    assert e.kv_tokens(node) == min(e.emulated_kv_tokens(node), (256 << 20) // 4096)
    roomy = Emulation(EmulationConfig.parse("lambdascale-testbed1:llama2-13b"), 8_000_000, 64)
    assert roomy.kv_tokens(node) == roomy.emulated_kv_tokens(node)


def test_bad_settings_name_the_valid_choices() -> None:
    with pytest.raises(SurgeError, match=r"lambdascale-testbed1.*paraserve-1"):
        EmulationConfig.parse("nope:llama2-13b")
    with pytest.raises(SurgeError, match="llama2-7b, llama2-13b"):
        EmulationConfig.parse("paraserve-1:gpt-5")
    with pytest.raises(SurgeError, match="PRESET:MODEL"):
        EmulationConfig.parse("paraserve-1")
    with pytest.raises(SurgeError, match="time-dilation"):
        EmulationConfig.parse("paraserve-1:llama2-7b", 0)


def test_an_emulated_cluster_gives_each_agent_its_scaled_rates(tmp_path: Path) -> None:
    e = emulation("lambdascale-testbed2:llama2-13b", d=4.0)
    cfg = LocalClusterConfig(num_nodes=5, link_gbps=123.0, emulation=e, remote_dir=tmp_path)
    cluster = LocalCluster(cfg)
    a = cluster.agent_config(4)
    s = e.scale
    assert (a.egress_gbps, a.ingress_gbps) == (s.gbps(100.0), s.gbps(100.0))  # not link_gbps
    assert a.disk_gbps == s.gbps(40.0) and a.pcie_gbps == s.gbps(512.0)
    assert a.remote_gbps == s.gbps(100.0)  # Testbed2 has no registry cap: the NIC share
    assert a.host_group is None and a.host_gbps is None  # alone on its machine here
    b = cluster.agent_config(1)
    assert b.host_mates == (0, 2, 3) and b.host_gbps == s.gbps(3200.0)
    assert (a.emulate, a.emulated_gpu, a.time_dilation) == (e.config.spec, "H800", 4.0)
    assert a.engine.max_kv_tokens == e.kv_tokens(e.nodes(5)[4])
    plain = LocalCluster(LocalClusterConfig(num_nodes=2, link_gbps=123.0)).agent_config(0)
    assert plain.egress_gbps == 123.0 and plain.emulate is None and plain.disk_gbps is None


def test_activations_and_kv_are_charged_at_their_own_ratio(tiny_store) -> None:
    """The tiny store's hidden state is a far larger share of its weights than llama2-13b's:
    a byte of it costs (weights ratio / hidden ratio) of a weight byte on the scaled links."""
    from surge.emulation import traffic_charges
    from surge.model.manifest import read_manifest

    manifest = read_manifest(tiny_store)
    model = load_model("llama2-13b")
    c = traffic_charges(model, manifest)
    arch = manifest.arch
    weights = manifest.total_bytes / model.total_bytes
    assert c.hidden == pytest.approx(weights / (arch.hidden_size * 4 / (5120 * 2)))
    kv_real = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 4
    assert c.kv == pytest.approx(weights / (kv_real / model.kv_bytes_per_token))
    assert 0 < c.hidden < 0.1 and 0 < c.kv < 1  # both far cheaper than a weight byte


@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_a_frame_paced_at_a_charge_takes_that_share_of_its_time() -> None:
    """`send(pace=f)` pays f tokens a byte at both ends: a 1 MB frame at 0.1 over a 4 MB/s
    link takes ~25 ms, not ~250 ms; a bad pace in a header is a frame error."""
    import asyncio
    import socket
    import time

    from surge.runtime.token_bucket import TokenBucket
    from surge.runtime.transport import Connection, header_pace
    from surge.wire import FrameError

    async def one(pace: float) -> float:
        listener = socket.create_server(("127.0.0.1", 0))
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
        listener.close()
        rate = 4e6
        tx = Connection(a, egress=TokenBucket(rate, 64 * 1024))
        rx = Connection(b, ingress=TokenBucket(rate, 64 * 1024))
        try:
            t0 = time.monotonic()
            receiving = asyncio.create_task(rx.recv())
            await tx.send({"op": "x"}, bytes(1_000_000), pace=pace)
            header, body = await asyncio.wait_for(receiving, 10)
            assert len(body) == 1_000_000 and header.get("pace", 1.0) == pace
            return time.monotonic() - t0
        finally:
            tx.close()
            rx.close()

    full, tenth = asyncio.run(one(1.0)), asyncio.run(one(0.1))
    assert full >= 0.2 and tenth < full / 3
    with pytest.raises(FrameError):
        header_pace({"pace": -1})
    assert header_pace({}) == 1.0
