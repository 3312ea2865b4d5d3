"""K/V is of the version whose weights computed it (docs/runtime.md, Versions;
`policy.versions.refuse_kv`). Real agents, a tiny model in two versions (node 0 holds
version 1, node 1 version 2, under one name):
- every way K/V enters an instance or a stage refuses another version's with one error that
  says so: `instance_adopt` with the parts in its payload (a P/D hand-off, a live batch the
  controller holds) or with sources its agent pulls (consolidation, live scaling), and a
  FlexPipe refactoring's `kv_push` -> `kv_import`; a stage of another version does not open
  (its layers would run on the other version's hidden states). Before: all were accepted,
  and the adopting instance decoded on version 1's K/V with version 2's weights;
- P/D with the prefill instance on version 1 and the decode instance on version 2: the
  hand-off is refused with a WARNING and the prefill instance, of the K/V's version, decodes
  the request: version 1's tokens, token-exact (before: version 2 decoded version 1's K/V,
  tokens of neither version)."""

import asyncio
import logging

import pytest

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.policy.blitzscale.pd import PdTargets
from surge.policy.versions import KV_REFUSED
from surge.runtime.client import ClusterClient
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.launch.local import LocalCluster
from surge.runtime.migration.pd_handoff import PdServing
from surge.runtime.protocol import (
    InstanceAdoptOp,
    InstanceOpenOp,
    KvExportOp,
    KvPushOp,
    KvSource,
    KvTarget,
    LoadOp,
    RegisterOp,
    StageOpenOp,
    StageStepOp,
)
from surge.runtime.server import Server
from surge.runtime.transport import RemoteError
from tests.runtime.conftest import MODEL
from tests.runtime.test_model_versions import BLOCKS, PARAMS, PROMPT, Versions


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Versions:
    return Versions(tmp_path_factory.mktemp("kv_versions"))


async def _two_versions(cluster: LocalCluster, versions: Versions) -> ClusterClient:
    """Node 0 holds version 1 in its gpu tier, node 1 version 2; peers wired."""
    client = cluster.client()
    await client.connect()
    await cluster.wire_peers(client)
    blocks = tuple(range(BLOCKS))
    for node, version in ((0, 1), (1, 2)):
        versions.use(version)
        await client.call(node, RegisterOp(model=MODEL, manifest=versions.manifest(version)))
        await client.call(node, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="gpu"))
    return client


def test_every_kv_path_refuses_another_versions_kv(make_cluster, versions: Versions) -> None:
    cluster = make_cluster(2, remote_dir=versions.registry)
    v1 = versions.manifest(1)
    layers = v1.arch.num_layers
    n = len(PROMPT)

    async def run() -> None:
        import torch

        client = await _two_versions(cluster, versions)
        try:
            whole = {"model": MODEL, "first_layer": 0, "end_layer": layers}
            with pytest.raises(RemoteError, match="a stage of another version"):
                await client.call(1, StageOpenOp(pipeline="p", digest=v1.digest, **whole))
            # Version 1's K/V of the prompt, in node 0's stage.
            await client.call(0, StageOpenOp(pipeline="p", digest=v1.digest, **whole))
            tokens = torch.tensor([list(PROMPT)], dtype=torch.int64)
            step = StageStepOp(
                pipeline="p", kind="tokens", shape=(1, n), batch=BatchMeta((0,), (0,), (n,))
            )
            await client.call_bytes(0, step, tokens.numpy())
            part, body = await client.call_bytes(
                0, KvExportOp(pipeline="p", seq_id=0, num_tokens=n)
            )
            assert part.digest == v1.digest
            for node in (0, 1):
                await client.call(node, InstanceOpenOp(instance=f"i{node}", model=MODEL))
            common = {"prompt_token_ids": PROMPT, "output_token_ids": (1,), "num_cached": n}
            # The parts in the payload (a P/D hand-off), then pulled by the agent itself.
            by_parts = InstanceAdoptOp(instance="i1", req_id="a", parts=(part,), **common)
            with pytest.raises(RemoteError, match=KV_REFUSED):
                await client.call_bytes(1, by_parts, bytes(body))
            source = KvSource(node=0, pipeline="p", seq_id=0, num_tokens=n)
            pulled = InstanceAdoptOp(instance="i1", req_id="b", sources=(source,), **common)
            with pytest.raises(RemoteError, match=KV_REFUSED):
                await client.call(1, pulled)
            # A refactoring's push into a stage of version 2.
            await client.call(1, StageOpenOp(pipeline="q", **whole))
            push = KvPushOp(
                pipeline="p",
                new_pipeline="q",
                seq_id=0,
                num_tokens=n,
                targets=(KvTarget(node=1, first_layer=0, end_layer=layers),),
            )
            with pytest.raises(RemoteError, match=KV_REFUSED):
                await client.call(0, push)
            # Its own version's K/V is taken, either way.
            same = InstanceAdoptOp(instance="i0", req_id="c", parts=(part,), **common)
            await client.call_bytes(0, same, bytes(body))
            same = InstanceAdoptOp(instance="i0", req_id="d", sources=(source,), **common)
            await client.call(0, same)
        finally:
            await client.close()

    asyncio.run(run())


def test_a_pd_handoff_to_another_version_is_decoded_where_prefilled(
    make_cluster, versions: Versions, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(2, remote_dir=versions.registry)

    async def run() -> list:
        client = await _two_versions(cluster, versions)
        server = Server(client, MODEL)
        server.pd = PdServing(server, PdTargets(1, 1), EngineConfig().max_kv_tokens)
        try:
            for node in (0, 1):  # node 0 prefills (version 1), node 1 decodes (version 2)
                ep = LocalEndpoint(client, node, MODEL, f"{MODEL}-node{node}")
                await ep.open()
                await server.add_endpoint(ep)
            reqs = [server.new_request(list(PROMPT), PARAMS) for _ in range(2)]
            for r in reqs:
                await server.submit(r)
            await server.wait_all(60)
            return reqs
        finally:
            await server.close()
            await client.close()

    with caplog.at_level(logging.WARNING, logger="surge.runtime.migration"):
        reqs = asyncio.run(run())
    for r in reqs:
        assert r.hops[0] == f"{MODEL}-node0" and r.hops[-1] == f"{MODEL}-node0", r.hops
        assert r.output_token_ids == versions.reference(1), r.hops
    refused = [m for m in caplog.messages if KV_REFUSED in m]
    assert refused and all(f"{MODEL}-node1 could not adopt" in m for m in refused), refused
