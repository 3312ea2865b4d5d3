"""Dropping a model on an agent (`DropModelOp`, what deleting a deployment sends) does not wait
for a load in flight: a registry read paced to ~2 s per block is aborted at its next chunk,
whichever tier it fills, the load's caller gets an error that says why, nothing of the model
is left (no block in any tier, no shared-memory segment, no disk file, no manifest), and the
model can be registered and loaded again. The drop comes once the load's first block is in
its tier (its arrival event; the disk tier announces none: its file, written whole and renamed
into place) and before its last: mid-transfer on a machine of any speed, where a fixed sleep
could come before the first byte or after the last block. A controller call cancelled
mid-exchange leaves the control connection in step (the next call gets its own answer, not
the cancelled load's)."""

import asyncio
import time
from pathlib import Path

import pytest

from surge.model.manifest import Manifest
from surge.runtime.protocol import BlockArrived, DropModelOp, LoadOp, RegisterOp, StatusOp, Tier
from surge.runtime.transport import RemoteError
from tests.runtime.conftest import MODEL

BLOCK_S = 2.0
"""Each block's read time at the registry's cap (the whole load ~8 s)."""
PROMPT_S = 2.0
"""Bound on an abort (measured: ~0.05 s)."""
FIRST_BLOCK_TIMEOUT_S = 30.0
"""Bound on the first block's read (~2 s at the cap)."""
POLL_S = 0.01
"""How often the disk tier's files are looked at (it announces no arrival)."""


def _segments(cluster) -> list[Path]:
    return list(Path("/dev/shm").glob(f"surge_{cluster.cluster_id}_*"))


class LoadProgress:
    """Which blocks of a remote load into `tier` of node 0 are in: its arrival events
    (host, gpu), or each block's file, complete (disk: `DiskTier.write` renames it into place
    whole, and emits no event). Make it before the load starts: it subscribes at once."""

    def __init__(self, client, disk: Path, manifest: Manifest, tier: Tier) -> None:
        self.client, self.disk, self.manifest, self.tier = client, disk, manifest, tier
        self.arrivals = client.subscribe((BlockArrived,), model=MODEL)
        self.seen: set[int] = set()

    def blocks_in(self) -> set[int]:
        if self.tier == "disk":
            return {
                b.index
                for b in self.manifest.blocks
                if (f := self.disk / b.file).is_file() and f.stat().st_size == b.size_bytes
            }
        while not self.arrivals.empty():
            self._note(self.arrivals.get_nowait())
        return set(self.seen)

    def _note(self, ev) -> None:
        if isinstance(ev, BlockArrived) and ev.node == 0 and ev.source == "remote":
            self.seen.add(ev.block)

    async def first_block(self) -> None:
        """Wait (bounded) until the first block is in."""
        async with asyncio.timeout(FIRST_BLOCK_TIMEOUT_S):
            while not self.blocks_in():
                if self.tier == "disk":
                    await asyncio.sleep(POLL_S)
                else:
                    self._note(await self.arrivals.get())

    def close(self) -> None:
        self.client.unsubscribe(self.arrivals)


def _remote_gbps(manifest: Manifest) -> float:
    biggest = max(b.size_bytes for b in manifest.blocks)
    return biggest * 8 / 1e9 / BLOCK_S


@pytest.mark.parametrize("tier", ["host", "gpu", "disk"])
def test_a_drop_aborts_a_load_in_flight_and_leaves_nothing(
    make_cluster, manifest: Manifest, tier: Tier
) -> None:
    # The gpu tier announces a block once it is in the model's runner, made at the first
    # landing: with the engine imported then too, a loaded machine announced block 0 after
    # every read was done (the drop then aborted nothing). Preloaded, it lands in ms.
    cluster = make_cluster(1, remote_gbps=_remote_gbps(manifest), preload_engine=tier == "gpu")
    disk = cluster.work_dir / "node0" / MODEL

    async def run() -> None:
        client = cluster.client()
        await client.connect()
        try:
            await client.call(0, RegisterOp(model=MODEL, manifest=manifest))
            blocks = tuple(range(manifest.num_blocks))
            progress = LoadProgress(client, disk, manifest, tier)
            load = asyncio.ensure_future(
                client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier=tier))
            )
            await progress.first_block()  # the first block is in, the next under way
            in_at_drop = progress.blocks_in()
            progress.close()
            # mid-transfer: the first block in, not the last (they are read in order)
            assert 0 in in_at_drop and blocks[-1] not in in_at_drop, in_at_drop
            assert not load.done()
            t0 = time.monotonic()
            reply, _ = await client.call_bytes(0, DropModelOp(model=MODEL))
            took_s = time.monotonic() - t0
            assert reply.aborted_ops == 1, reply
            assert took_s < PROMPT_S, f"the drop waited {took_s:.1f} s for the load"
            with pytest.raises(RemoteError, match="dropped"):
                await asyncio.wait_for(load, PROMPT_S)
            status = await client.call(0, StatusOp())
            assert status.models == {}, status.models
            assert _segments(cluster) == []
            assert not disk.exists(), list(disk.iterdir())
            await asyncio.sleep(BLOCK_S)  # nothing written later by a read left running
            assert _segments(cluster) == [] and not disk.exists()

            # The model comes back: registered and one block loaded afresh.
            await client.call(0, RegisterOp(model=MODEL, manifest=manifest))
            await client.call(0, LoadOp(model=MODEL, blocks=(0,), source="remote", tier=tier))
            held = (await client.call(0, StatusOp())).models[MODEL]
            assert getattr(held, tier) == (0,), held
        finally:
            await client.close()

    asyncio.run(run())


def test_a_cancelled_call_leaves_the_control_connection_in_step(
    make_cluster, manifest: Manifest
) -> None:
    cluster = make_cluster(1, remote_gbps=_remote_gbps(manifest))

    async def run() -> None:
        client = cluster.client()
        await client.connect()
        try:
            await client.call(0, RegisterOp(model=MODEL, manifest=manifest))
            op = LoadOp(model=MODEL, blocks=(0, 1, 2, 3), source="remote", tier="host")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.call(0, op), BLOCK_S / 2)
            # Its own answer, at once: not the load's, not after it.
            t0 = time.monotonic()
            status = await asyncio.wait_for(client.call(0, StatusOp()), PROMPT_S)
            assert status.node == 0 and time.monotonic() - t0 < PROMPT_S
            await client.call_bytes(0, DropModelOp(model=MODEL))
            assert _segments(cluster) == []
        finally:
            await client.close()

    asyncio.run(run())
