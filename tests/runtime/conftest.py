"""Fixtures for the data plane: a registry of tiny stores and local agent clusters that are
always stopped (agents, sockets, shared memory), even when a test fails; netns clusters
(`make_netns`, `needs_netns`: agents in network namespaces) that leave nothing behind."""

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from surge.model.importer import import_checkpoint
from surge.model.manifest import Manifest, read_manifest
from surge.runtime.client import ClusterClient
from surge.runtime.launch import netns
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.launch.netns_cluster import NetnsCluster, NetnsClusterConfig
from surge.runtime.protocol import BlockArrived, LoadOp, RegisterOp, Tier

MODEL = "tiny"

MISSING = netns.missing_requirements()
needs_netns = pytest.mark.skipif(bool(MISSING), reason="netns cluster needs " + "; ".join(MISSING))
"""Skips a test where the machine cannot make namespaces (not root, no iproute2, no cgroup
CPU controller)."""


def gone(pid: int) -> bool:
    """The process has exited (a zombie whose parent died counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"
    except (FileNotFoundError, IndexError):
        return True


@pytest.fixture(scope="session")
def registry(tiny_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A registry directory holding the tiny model as `tiny`, cut into 4 blocks."""
    root = tmp_path_factory.mktemp("registry")
    import_checkpoint(tiny_hf, root / MODEL, num_blocks=4, progress=False)
    return root


@pytest.fixture(scope="session")
def manifest(registry: Path) -> Manifest:
    return read_manifest(registry / MODEL)


def assert_all_stopped(cluster: LocalCluster) -> None:
    assert all(p.poll() is not None for p in cluster.procs.values()), (
        "an agent outlived its cluster"
    )
    assert not list(Path("/dev/shm").glob(f"surge_{cluster.cluster_id}_*")), "shared memory leaked"


@pytest.fixture
def make_cluster(registry: Path) -> Iterator:
    """Start local clusters; every one is stopped and checked clean at teardown."""
    started: list[LocalCluster] = []

    def make(num_nodes: int, **kwargs) -> LocalCluster:
        kwargs.setdefault("remote_dir", registry)
        kwargs.setdefault("preload_engine", False)
        cluster = LocalCluster(LocalClusterConfig(num_nodes=num_nodes, **kwargs))
        started.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in started:
        cluster.stop()
        assert_all_stopped(cluster)


@pytest.fixture
def make_netns(registry: Path) -> Iterator:
    """Start netns clusters; each is stopped at teardown and must leave nothing behind."""
    started: list[NetnsCluster] = []

    def make(num_nodes: int, **kwargs) -> NetnsCluster:
        kwargs.setdefault("remote_dir", registry)
        kwargs.setdefault("preload_engine", False)
        cluster = NetnsCluster(NetnsClusterConfig(num_nodes=num_nodes, **kwargs))
        started.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in started:
        pids = [p.pid for p in cluster.procs.values()]
        cluster.stop()
        assert netns.resources(cluster.prefix) == [], "namespaces, links or cgroups leaked"
        assert all(gone(pid) for pid in pids), "an agent outlived its cluster"


async def connected(
    cluster: LocalCluster,
    manifest: Manifest,
    loads: dict[int, list[int]] | None = None,
    tier: Tier = "host",
) -> ClusterClient:
    """A client with peers wired and the model registered everywhere; `loads` says which
    blocks each node reads from the registry into `tier` (default: all blocks on node 0)."""
    client = cluster.client()
    await client.connect()
    await cluster.wire_peers(client)
    await client.broadcast(RegisterOp(model=MODEL, manifest=manifest))
    if loads is None:
        loads = {0: list(range(manifest.num_blocks))}
    await asyncio.gather(
        *(
            client.call(node, LoadOp(model=MODEL, blocks=tuple(blocks), source="remote", tier=tier))
            for node, blocks in loads.items()
        )
    )
    return client


async def first_block_at(client: ClusterClient, node: int, timeout_s: float = 30.0) -> BlockArrived:
    """The first block a multicast lands on `node`, awaited (at most `timeout_s`): a fault
    injected then comes mid-transfer on a machine of any speed, where a fixed sleep could
    come before the first byte (a slow start) or after the last block (a fast machine) and
    the test pass without testing the case. Await it before anything else awaits once the
    multicast's task is made: it subscribes on entry, so no arrival is missed."""
    arrivals = client.subscribe((BlockArrived,), model=MODEL)
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                ev = await arrivals.get()
                if isinstance(ev, BlockArrived) and ev.node == node and ev.mc_id is not None:
                    return ev
    finally:
        client.unsubscribe(arrivals)


def record_ops(client: ClusterClient, record: Callable[[str], None]) -> None:
    """From now on, `record` the type name of every op the controller sends through
    `client` (tests that K/V goes agent to agent: no `KvExportOp` / `KvImportOp` here)."""
    for name in ("call", "call_bytes"):
        orig = getattr(client, name)

        async def recorded(node, op, *args, _orig=orig):
            record(type(op).__name__)
            return await _orig(node, op, *args)

        setattr(client, name, recorded)
