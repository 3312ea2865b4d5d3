"""A deployment of a model's new version never serves the old one (docs/control.md, Versions;
`policy/versions.py`). An agent that outlived its controller (`surge serve --launcher
static`, as a StatefulSet's) still holds version 1 of the name in its host and device memory
with an instance running on it, as an old controller or a failed delete left it, while a
`surge serve` runs; version 2 (other weights, imported anew under the same name) is deployed
(POST /v1/deployments). The controller drops version 1 there before it registers version 2
(one WARNING that names it), and the first request is answered with version 2's tokens,
token-exact against a local engine of version 2's store. Before: the agent kept version 1's
manifest, its host copy counted as the deployment's kept copy, and the request was served
version 1's tokens. The parameter pool takes in an agent's copies only at the deployment's
version."""

import asyncio
from pathlib import Path

import pytest

from surge.control.pool import ParameterPool
from surge.model.importer import import_checkpoint
from surge.model.manifest import Manifest, read_manifest
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import TinyModelConfig
from surge.runtime.client import ClusterClient
from surge.runtime.launch.local import LocalCluster
from surge.runtime.protocol import (
    InstanceOpenOp,
    LoadOp,
    ModelHolding,
    RegisterOp,
    StatusReply,
)
from tests.control.conftest import Reference, start_serve
from tests.control.strategy_run import agent_statuses, local_cluster

PROMPT = "Which version answers"
MODEL = "versioned"
"""The deployment's name (not the default store's, which a config with none deploys)."""


def second_version(tmp_path: Path, v1_store: Path, name: str) -> tuple[Path, Manifest, Manifest]:
    """Version 2 of model `name` (other weights: another seed) imported at `tmp_path/v2`;
    that store and the manifests of version 1 (`v1_store`) and 2 (different digests)."""
    hf = create_tiny_model(tmp_path / "hf2", TinyModelConfig(seed=1))
    v2_store = tmp_path / "v2"
    import_checkpoint(hf, v2_store, name=name, progress=False)
    v1, v2 = read_manifest(v1_store), read_manifest(v2_store)
    assert v1.digest != v2.digest
    return v2_store, v1, v2


async def hold_old_version(cluster: LocalCluster, v1: Manifest) -> None:
    """Node 0 holds `v1` in its host and gpu tiers and runs the instance a controller names
    there, as if no controller had ever dropped it."""
    client = ClusterClient(cluster.addresses, cluster.token)
    await client.connect()
    try:
        await client.call(0, RegisterOp(model=MODEL, manifest=v1))
        blocks = tuple(range(v1.num_blocks))
        await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="host"))
        await client.call(0, LoadOp(model=MODEL, blocks=blocks, source="host", tier="gpu"))
        await client.call(0, InstanceOpenOp(instance=f"{MODEL}-node0", model=MODEL))
    finally:
        await client.close()


async def held_digests(cluster: LocalCluster) -> dict[int, str]:
    """Each node's version (digest) of MODEL, where it holds one."""
    statuses = await agent_statuses(cluster)
    return {n: s.models[MODEL].digest for n, s in statuses.items() if MODEL in s.models}


@pytest.mark.timeout(300)
def test_a_new_version_deployed_never_serves_the_old_one(
    tmp_path, surge_home, tiny_store_dir, reference
) -> None:
    v2_store, v1, v2 = second_version(tmp_path, tiny_store_dir, MODEL)
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2)
    token_file = tmp_path / "token"
    config = {"slots_per_node": 1, "tick_s": 0.05, "log_level": "info", "deployments": []}
    with cluster:
        token_file.write_text(cluster.token + "\n")
        agents = ",".join(f"{h}:{p}" for h, p in cluster.addresses.values())
        static = ("--launcher", "static", "--agents", agents, "--token-file", str(token_file))
        serve = start_serve(tmp_path, surge_home, config, *static)
        try:
            link = state / "registry" / MODEL
            link.symlink_to(tiny_store_dir, target_is_directory=True)  # version 1, for its load
            asyncio.run(hold_old_version(cluster, v1))
            link.unlink()
            r = serve.http.post("/v1/deployments", json={"name": MODEL, "model": str(v2_store)})
            assert r.status_code in (200, 201), r.text
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                    "ignore_eos": True}  # fmt: skip
            r = serve.http.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            text = r.json()["choices"][0]["text"]
            assert text == Reference(v2_store)(PROMPT, 8)
            assert text != reference(PROMPT, 8), "the two versions should answer differently"
            logged = (tmp_path / "serve.log").read_text()
            dropped = (
                f"{MODEL}: node 0 holds another version ({v1.digest[:19]}, deploying "
                f"{v2.digest[:19]}; running: ['{MODEL}-node0']): dropped"
            )
            assert dropped in logged, logged
            digests = asyncio.run(held_digests(cluster))
            assert set(digests.values()) == {v2.digest}, digests
        finally:
            serve.stop()


def _status(node: int, digest: str) -> StatusReply:
    holding = ModelHolding(host=(0, 1), gpu=(0, 1), disk=(0, 1), digest=digest)
    return StatusReply(node=node, port=1, models={"m": holding}, bytes_in=0, bytes_out=0, peers=())


def test_the_pool_takes_in_only_the_deployments_version() -> None:
    pool = ParameterPool()
    pool.add_model("m", 2, "sha256:2")
    pool.load_status(0, _status(0, "sha256:1"))
    pool.load_status(1, _status(1, "sha256:2"))
    pool.load_status(2, _status(2, ""))
    for tier in ("gpu", "host", "disk"):
        assert pool.complete("m", tier) == [1]
    pool.drop_model("m")
    assert "m" not in pool.versions
