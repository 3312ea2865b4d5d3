"""Shared memory that runs out (issue 36): a host copy with no room is refused before it
starts, and a host copy that fails or is evicted half-way leaves no segment behind (a
deleted deployment used to leave its segments, and /dev/shm stayed full)."""

import asyncio
import shutil
from pathlib import Path

import pytest

from surge.model.manifest import Manifest
from surge.runtime.protocol import EvictOp, LoadOp, RegisterOp
from surge.runtime.transport import RemoteError
from tests.runtime.conftest import MODEL


def _segments(cluster) -> list[Path]:
    return list(Path("/dev/shm").glob(f"surge_{cluster.cluster_id}_*"))


async def _client(cluster, manifest: Manifest):
    client = cluster.client()
    await client.connect()
    await cluster.wire_peers(client)
    await client.broadcast(RegisterOp(model=MODEL, manifest=manifest))
    return client


def _load(blocks: range) -> LoadOp:
    return LoadOp(model=MODEL, blocks=tuple(blocks), source="remote", tier="host")


def test_no_room_is_refused_before_a_byte_is_copied(make_cluster, manifest: Manifest) -> None:
    cluster = make_cluster(1, extra_args={0: ["--fault-shm-free-bytes", "1000"]})

    async def run() -> None:
        client = await _client(cluster, manifest)
        try:
            with pytest.raises(RemoteError, match="no room in shared memory") as e:
                await client.call(0, _load(range(manifest.num_blocks)))
            assert "1000" not in str(e.value) or "0.0 MB free" in str(e.value)
            assert "lower host_cache_gb" in str(e.value)
            assert _segments(cluster) == []
        finally:
            await client.close()

    asyncio.run(run())


def test_a_copy_that_fails_half_way_removes_its_segments(
    make_cluster, manifest: Manifest, registry: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "registry"
    shutil.copytree(registry, broken)
    last = broken / MODEL / manifest.blocks[-1].file
    last.write_bytes(last.read_bytes()[:100])  # the last block is truncated
    cluster = make_cluster(1, remote_dir=broken)

    async def run() -> None:
        client = await _client(cluster, manifest)
        try:
            with pytest.raises(RemoteError):
                await client.call(0, _load(range(manifest.num_blocks)))
            assert _segments(cluster) == [], "the blocks before the bad one stayed"
        finally:
            await client.close()

    asyncio.run(run())


def test_an_eviction_during_a_copy_leaves_no_segment(make_cluster, manifest: Manifest) -> None:
    # ~4 MB at 0.02 Gbit/s: the copy takes over a second, the eviction comes in the middle.
    cluster = make_cluster(1, remote_gbps=0.02)

    async def run() -> None:
        client = await _client(cluster, manifest)
        try:
            load = asyncio.ensure_future(client.call(0, _load(range(manifest.num_blocks))))
            await asyncio.sleep(0.4)
            assert not load.done()
            blocks = tuple(range(manifest.num_blocks))
            await client.call(0, EvictOp(model=MODEL, blocks=blocks, tier="host"))
            try:  # evicted under it (or, had the eviction queued behind it, loaded first)
                await load
            except RemoteError as e:
                assert "evicted while it loaded" in str(e)
            assert _segments(cluster) == []
        finally:
            await client.close()

    asyncio.run(run())
