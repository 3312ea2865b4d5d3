"""`surge serve --launcher ray`: node agents as Ray actors on a local Ray cluster that the
module starts once on loopback (and shuts down), data over surge's own transport; greedy
answers equal a local run, and no agent outlives the server. A `RayCluster` given the address
of a Ray its caller initialized leaves that Ray up when it stops (so the tests share one)."""

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'surge[ray]')")

from tests.control.conftest import start_serve  # noqa: E402
from tests.control.test_serve_openai import GREEDY, MODEL  # noqa: E402

# One local Ray cluster on 127.0.0.1 for the module: under pytest-xdist two at once on the 2
# workers would compete for Ray's default ports and the cores; one worker runs them all.
pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module")
def ray_address():
    """A one-node Ray cluster on 127.0.0.1, no dashboard; its GCS address. Started once for
    the module (a Ray start is seconds of CPU): `surge serve` connects to it as a driver of
    its own, and the tests' `RayCluster`s use this process's connection and leave it up."""
    ctx = ray.init(
        num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False
    )
    try:
        yield ctx.address_info["gcs_address"]
    finally:
        ray.shutdown()


@pytest.mark.timeout(240)
def test_serve_with_ray_actors(ray_address, tmp_path, surge_home, tiny_store_dir, reference):
    import openai

    config = {"nodes": 2, "deployments": [{"name": MODEL, "model": str(tiny_store_dir)}]}
    s = start_serve(tmp_path, surge_home, config, "--launcher", "ray", "--ray-address", ray_address)
    try:
        nodes = s.http.get("/v1/nodes").json()["data"]
        assert [n["up"] for n in nodes] == [True, True]
        assert all(n["pid"] and n["address"][0] == "127.0.0.1" for n in nodes)
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        out = c.completions.create(model=MODEL, prompt="Ray says", max_tokens=8, **GREEDY)
        assert out.choices[0].text == reference("Ray says", 8)
    finally:
        s.stop()  # fails the test if an agent outlived surge serve


@pytest.mark.timeout(240)
def test_agents_packed_on_one_ray_node_report_one_host_group_to_the_planner(ray_address):
    """Three agents packed on the one Ray node form one host group: each reports it, and the
    multicast planner's cluster has them as one fast group (one network transfer feeds it)."""
    import asyncio

    from surge.policy.multicast.topology import multicast_cluster
    from surge.runtime.client import ClusterClient
    from surge.runtime.launch.ray_cluster import RayCluster, RayClusterConfig
    from surge.runtime.protocol import LinkReport, SetPeersOp

    cluster = RayCluster(
        RayClusterConfig(num_nodes=3, address=ray_address, placement="pack", preload_engine=False)
    )
    cluster.start()
    try:

        async def links() -> list:
            client = ClusterClient(cluster.addresses, cluster.token)
            await client.connect()
            try:
                hello = await client.broadcast(SetPeersOp(peers=dict(cluster.addresses)))
            finally:
                await client.close()
            return [LinkReport.planned(hello[n].links) for n in sorted(hello)]

        got = asyncio.run(links())
    finally:
        cluster.stop()
    assert ray.is_initialized()  # the caller's Ray (this module's cluster) stays up
    assert len({link.host for link in got}) == 1 and got[0].host.startswith("ray-")
    assert multicast_cluster(1, got).nvlink_groups == ((0, 1, 2),)


@pytest.mark.timeout(120)
def test_spread_placement_that_cannot_hold_is_one_clear_error_in_time(ray_address):
    """One agent per Ray node on a one-node cluster: refused within the start timeout."""
    from surge.errors import SurgeError
    from surge.runtime.launch.ray_cluster import RayCluster, RayClusterConfig

    spread = RayCluster(
        RayClusterConfig(num_nodes=2, address=ray_address, placement="spread", start_timeout_s=5)
    )
    with pytest.raises(SurgeError, match=r"Ray could not place 2 agents \(STRICT_SPREAD"):
        spread.start()
