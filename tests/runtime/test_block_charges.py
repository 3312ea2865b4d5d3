"""Under GPU-time emulation every block of the real store moves in one emulated block's
time, whatever its bytes (`surge.emulation.block_charges`): the emulated model moves in
equal blocks (λScale §4.2, the simulator's `total / num_blocks`), while the real store's
first and last blocks also hold the embeddings and the head. Paced by bytes alone, a
16-layer tiny Llama's end blocks lasted 1.58 emulated blocks per hop and λScale's K=2
execute-while-load opened its first pipeline 18% after the simulator's (docs/emulation.md).
The charge rides on each block's frame (both ends' token buckets) and on every tier read."""

import asyncio
from pathlib import Path

import pytest

from surge.emulation import Emulation, EmulationConfig, block_charges
from surge.model.manifest import Manifest
from surge.runtime.handshake import connect
from surge.runtime.node.tiers import DiskTier
from surge.runtime.protocol import GetBlockOp, LoadOp, RegisterOp
from tests.runtime.conftest import MODEL


def test_every_block_is_charged_as_one_mean_block(manifest: Manifest) -> None:
    sizes = [b.size_bytes for b in manifest.blocks]
    assert sizes[0] > sizes[1], "the tiny store's first block holds the embeddings too"
    charges = block_charges(manifest)
    mean = manifest.total_bytes / manifest.num_blocks
    assert [c * s for c, s in zip(charges, sizes, strict=True)] == pytest.approx(
        [mean] * len(sizes)
    )
    assert charges[0] < 1 < charges[1]  # the end block moves faster per byte, the middle slower
    assert sum(c * s for c, s in zip(charges, sizes, strict=True)) == pytest.approx(
        manifest.total_bytes
    )  # the whole store still moves in the emulated model's time


class _Bucket:
    """Records what a tier read asks its token bucket for."""

    def __init__(self) -> None:
        self.taken: list[int] = []

    def consume_blocking(self, num_bytes: int, background: bool = False, stop=None) -> None:
        self.taken.append(num_bytes)


def test_a_tier_read_charges_its_bucket_per_byte(
    manifest: Manifest, registry: Path, tmp_path
) -> None:
    bucket = _Bucket()
    disk = DiskTier(tmp_path, bucket)  # type: ignore[arg-type]
    info = manifest.blocks[0]
    data = (registry / MODEL / info.file).read_bytes()
    disk.write(MODEL, info, memoryview(data))
    out = memoryview(bytearray(info.size_bytes))
    disk.read_into(MODEL, info, out, charge=0.5)
    assert bytes(out) == data
    assert sum(bucket.taken) == pytest.approx(info.size_bytes * 0.5, abs=len(bucket.taken))


@pytest.mark.parametrize("emulated", [False, True])
def test_an_agent_sends_each_block_at_its_charge(emulated, make_cluster, manifest) -> None:
    """The frame of a pulled block carries its charge (the receiver's ingress reads it from
    the header); a plain agent sends bytes as bytes."""
    emulation = (
        Emulation.for_store(EmulationConfig.parse("lambdascale-testbed1:llama2-13b", 1.0), manifest)
        if emulated
        else None
    )
    cluster = make_cluster(1, emulation=emulation)

    async def run() -> list[tuple[float, bytes]]:
        client = cluster.client()
        await client.connect()
        await client.broadcast(RegisterOp(model=MODEL, manifest=manifest))
        blocks = tuple(range(manifest.num_blocks))
        await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="gpu"))
        host, port = cluster.addresses[0]
        conn = await connect(host, port, cluster.token, "peer-test")
        got = []
        try:
            for b in (0, 1):
                ask = GetBlockOp(model=MODEL, block=b, step=0.0, wait_s=5.0)
                header, body = await conn.request(ask.to_json())
                got.append((header.get("pace", 1.0), bytes(body)))
        finally:
            conn.close()
            await client.close()
        return got

    got = asyncio.run(run())
    want = block_charges(manifest) if emulated else (1.0,) * manifest.num_blocks
    assert [pace for pace, _ in got] == pytest.approx(list(want[:2]))
    assert [len(body) for _, body in got] == [b.size_bytes for b in manifest.blocks[:2]]
