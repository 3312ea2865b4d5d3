"""A model's version is its manifest's digest, and a copy is of one version (docs/runtime.md,
Versions; `policy/versions.py`). Real agents, a tiny model made here in two versions with
different weights, replaced under the same name in the registry as a user's import again:
- a `register` of version 2 where version 1 is held in every tier replaces it: no block of
  version 1 is left (host, gpu, disk, shared memory), and what the next generate serves is
  version 2, token-exact against a fresh engine of version 2's store (before: the agent kept
  version 1's manifest and copies, and served version 1's tokens from its host copy);
- a `register` of version 2 while an instance runs version 1 is refused with one error that
  names the instance and the fix; once it is closed, the register replaces;
- a peer holding version 1 is never a source of version 2: a multicast's pulls from it are
  refused before a byte moves (before: its blocks crossed the link and failed their
  checksums, pull after pull), and a host mate's device copy of version 1 is not opened
  (before: it was, and served version 1's weights);
- a disk tier left by an earlier run of the node with version 1's files is emptied when
  version 2 is registered (its block files are named by index: sizes alone match)."""

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.model.importer import import_checkpoint
from surge.model.manifest import Manifest, read_manifest
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import TinyModelConfig
from surge.runtime.client import ClusterClient
from surge.runtime.launch.local import LocalCluster
from surge.runtime.protocol import (
    BlockArrived,
    BlockCorrupt,
    GenerateOp,
    InstanceCloseOp,
    InstanceOpenOp,
    LoadOp,
    MulticastOp,
    OpenMateCopyOp,
    PullFailed,
    ReceiveDone,
    RegisterOp,
    StatusOp,
)
from surge.runtime.transport import RemoteError
from tests.runtime.conftest import MODEL

PROMPT = (5, 17, 42, 7)
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
BLOCKS = 4
EVENT_TIMEOUT_S = 60.0


class Versions:
    """A registry holding `MODEL` at version 1, and version 2 beside it to import over it."""

    def __init__(self, root: Path) -> None:
        self.registry = root / "registry"
        self.stores = {}
        for version, seed in ((1, 0), (2, 1)):
            hf = create_tiny_model(root / f"hf{version}", TinyModelConfig(seed=seed))
            store = root / f"v{version}"
            import_checkpoint(hf, store, name=MODEL, num_blocks=BLOCKS, progress=False)
            self.stores[version] = store
        self.use(1)

    def manifest(self, version: int) -> Manifest:
        return read_manifest(self.stores[version])

    def use(self, version: int) -> None:
        """The registry's `MODEL` is `version` now (imported over the old one)."""
        target = self.registry / MODEL
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(self.stores[version], target)

    def reference(self, version: int) -> list[int]:
        """Greedy tokens of a fresh local engine of `version`'s store."""
        engine = LLMEngine(self.manifest(version), EngineConfig(device="cpu"))
        return list(engine.generate([list(PROMPT)], PARAMS)[0].token_ids)


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Versions:
    v = Versions(tmp_path_factory.mktemp("versions"))
    assert v.manifest(1).digest != v.manifest(2).digest
    return v


def _with_client(
    cluster: LocalCluster, body: Callable[[ClusterClient], Awaitable[None]], wire: bool = False
) -> None:
    """Run `body` with a client of the cluster (its peers wired first with `wire`)."""

    async def run() -> None:
        client = cluster.client()
        await client.connect()
        try:
            if wire:
                await cluster.wire_peers(client)
            await body(client)
        finally:
            await client.close()

    asyncio.run(run())


def _segments(cluster) -> list[Path]:
    return list(Path("/dev/shm").glob(f"surge_{cluster.cluster_id}_*"))


def _block_files(disk: Path) -> list[str]:
    return sorted(p.name for p in disk.glob("*") if not p.name.startswith("."))


async def _load_everywhere(client, node: int) -> None:
    """The registry's version into the host, gpu (from the host copy) and disk tiers."""
    blocks = tuple(range(BLOCKS))
    await client.call(node, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="host"))
    await client.call(node, LoadOp(model=MODEL, blocks=blocks, source="host", tier="gpu"))
    await client.call(node, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="disk"))


async def _generate(client, node: int) -> list[int]:
    reply = await client.call(node, GenerateOp(model=MODEL, prompt_token_ids=PROMPT, params=PARAMS))
    return list(reply.token_ids)


def test_a_new_version_replaces_the_old_in_every_tier_and_serves(
    make_cluster, versions: Versions
) -> None:
    versions.use(1)
    cluster = make_cluster(1, remote_dir=versions.registry)
    disk = cluster.work_dir / "node0" / MODEL
    v1, v2 = versions.manifest(1), versions.manifest(2)

    async def run(client: ClusterClient) -> None:
        await client.call(0, RegisterOp(model=MODEL, manifest=v1))
        await _load_everywhere(client, 0)
        assert await _generate(client, 0) == versions.reference(1)
        held = (await client.call(0, StatusOp())).models[MODEL]
        assert held.digest == v1.digest and len(held.host) == BLOCKS, held

        versions.use(2)  # the user imports version 2 under the same name
        await client.call(0, RegisterOp(model=MODEL, manifest=v2))
        held = (await client.call(0, StatusOp())).models[MODEL]
        assert held.digest == v2.digest, held
        assert (held.host, held.gpu, held.disk) == ((), (), ()), held
        assert _segments(cluster) == [], "version 1's host copy is still in shared memory"
        assert _block_files(disk) == [], "version 1's block files are still on disk"

        await _load_everywhere(client, 0)
        tokens = await _generate(client, 0)
        assert tokens == versions.reference(2)
        assert tokens != versions.reference(1), "the two versions should differ"
        held = (await client.call(0, StatusOp())).models[MODEL]
        assert len(held.host) == len(held.gpu) == len(held.disk) == BLOCKS, held
        # The same version again changes nothing.
        await client.call(0, RegisterOp(model=MODEL, manifest=v2))
        assert (await client.call(0, StatusOp())).models[MODEL] == held

    _with_client(cluster, run)


def test_a_register_while_an_old_instance_runs_is_refused(make_cluster, versions: Versions) -> None:
    versions.use(1)
    cluster = make_cluster(1, remote_dir=versions.registry)
    v1, v2 = versions.manifest(1), versions.manifest(2)
    instance = f"{MODEL}-node0"

    async def run(client: ClusterClient) -> None:
        await client.call(0, RegisterOp(model=MODEL, manifest=v1))
        blocks = tuple(range(BLOCKS))
        await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="gpu"))
        await client.call(0, InstanceOpenOp(instance=instance, model=MODEL))
        with pytest.raises(RemoteError) as refused:
            await client.call(0, RegisterOp(model=MODEL, manifest=v2))
        message = str(refused.value)
        assert f"node 0 runs {instance} on version {v1.digest[:19]}" in message, message
        assert "instance_close" in message and "drop_model" in message, message
        held = (await client.call(0, StatusOp())).models[MODEL]
        assert held.digest == v1.digest and len(held.gpu) == BLOCKS, held
        assert await _generate(client, 0) == versions.reference(1)

        await client.call(0, InstanceCloseOp(instance=instance))
        await client.call(0, RegisterOp(model=MODEL, manifest=v2))
        held = (await client.call(0, StatusOp())).models[MODEL]
        assert held.digest == v2.digest and held.gpu == (), held

    _with_client(cluster, run)


def test_a_peer_of_another_version_is_never_a_source(make_cluster, versions: Versions) -> None:
    versions.use(1)
    cluster = make_cluster(2, remote_dir=versions.registry)
    v1, v2 = versions.manifest(1), versions.manifest(2)

    async def run(client: ClusterClient) -> None:
        await client.call(0, RegisterOp(model=MODEL, manifest=v1))
        blocks = tuple(range(BLOCKS))
        await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="host"))
        await client.call(1, RegisterOp(model=MODEL, manifest=v2))
        events = client.subscribe(
            (BlockArrived, BlockCorrupt, PullFailed, ReceiveDone), model=MODEL
        )
        recv = tuple((b, b, 0) for b in blocks)  # every block from node 0 (version 1)
        op = MulticastOp(mc_id="mc", model=MODEL, recv=recv, tier="host", wait_s=1.0)
        await client.call(1, op)
        seen: list = []
        async with asyncio.timeout(EVENT_TIMEOUT_S):
            while not any(isinstance(e, ReceiveDone) for e in seen):
                seen.append(await events.get())
        client.unsubscribe(events)
        failed = [e for e in seen if isinstance(e, PullFailed)]
        assert sorted(e.block for e in failed) == list(blocks), seen
        assert all("another version" in e.reason for e in failed), failed
        assert not [e for e in seen if isinstance(e, (BlockCorrupt, BlockArrived))], seen
        statuses = await client.broadcast(StatusOp())
        assert statuses[0].bytes_out == 0, "version 1's blocks crossed the link"
        assert statuses[1].models[MODEL].host == (), statuses[1].models[MODEL]

    _with_client(cluster, run, wire=True)


def test_a_disk_tier_of_another_version_left_by_an_earlier_run_is_emptied(
    make_cluster, versions: Versions
) -> None:
    versions.use(1)
    cluster = make_cluster(1, remote_dir=versions.registry)
    v1, v2 = versions.manifest(1), versions.manifest(2)
    disk = cluster.work_dir / "node0" / MODEL

    async def run(client: ClusterClient) -> None:
        await client.call(0, RegisterOp(model=MODEL, manifest=v1))
        blocks = tuple(range(BLOCKS))
        await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="disk"))

    _with_client(cluster, run)
    assert len(_block_files(disk)) == BLOCKS
    cluster.kill(0)
    cluster.restart(0)  # a new agent process on the same disk directory

    async def again(client: ClusterClient) -> None:
        await client.call(0, RegisterOp(model=MODEL, manifest=v2))
        held = (await client.call(0, StatusOp())).models[MODEL]
        assert held.digest == v2.digest and held.disk == (), held
        assert _block_files(disk) == []

    _with_client(cluster, again)


def test_a_host_mate_of_another_version_shares_no_device_copy(
    make_cluster, versions: Versions
) -> None:
    """The NVLink analogue (`open_mate_copy` on the fake GPU): a mate's device copy of
    version 1 is not opened as version 2 (before: its sizes matched, so node 1 mapped it and
    served version 1's weights under version 2's name)."""
    versions.use(1)
    cluster = make_cluster(2, remote_dir=versions.registry, host_groups=((0, 1),), device="fake")
    v1, v2 = versions.manifest(1), versions.manifest(2)

    async def run(client: ClusterClient) -> None:
        await client.call(0, RegisterOp(model=MODEL, manifest=v1))
        blocks = tuple(range(BLOCKS))
        await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="gpu"))
        await client.call(1, RegisterOp(model=MODEL, manifest=v2))
        with pytest.raises(RemoteError, match="a copy of another version is no source"):
            await client.call(1, OpenMateCopyOp(model=MODEL, blocks=blocks, mate=0))
        assert (await client.call(1, StatusOp())).models[MODEL].gpu == ()

    _with_client(cluster, run, wire=True)
