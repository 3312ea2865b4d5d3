"""A controller restart on running agents: the instance the old controller left behind is
adopted with its GPU copy (no load), and the parameter pool agrees with what the agents hold.
A GPU copy with no instance (a load the old controller had under way) is released. Before
adoption every GPU copy of the old controller was evicted and loaded again."""

import asyncio

from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.model.tokenizer import load_tokenizer
from surge.runtime.client import ClusterClient
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.protocol import LoadOp
from tests.control.strategy_run import (
    PROMPTS,
    agent_statuses,
    check_tokens,
    deploy,
    local_cluster,
    run_burst,
    wait_until,
)
from tests.control.test_serve_openai import MODEL


async def _gpu_blocks(cluster: LocalCluster) -> dict[int, tuple[int, ...]]:
    """GPU blocks of MODEL on each agent, asked directly (not through a controller)."""
    statuses = await agent_statuses(cluster)
    return {n: s.models[MODEL].gpu if MODEL in s.models else () for n, s in statuses.items()}


def test_new_controller_adopts_the_instance_an_old_one_left(tmp_path, tiny_store_dir):
    state = tmp_path / "state"
    (state / "registry").mkdir(parents=True)
    tok = load_tokenizer(tiny_store_dir / "tokenizer.json")
    cluster = LocalCluster(LocalClusterConfig(num_nodes=2, remote_dir=state / "registry"))
    cfg = ControllerConfig(state_dir=state, nodes=2)
    spec = {"name": MODEL, "model": str(tiny_store_dir), "autoscaling": {"keep_alive_s": 600}}

    async def run() -> None:
        first = Controller(cfg, cluster.addresses, cluster.token)
        await first.start()
        try:
            dep = await first.create(spec)
            ids = tok.encode("Leave a copy").ids
            req = await first.submit(dep, ids, SamplingParams(max_tokens=4, ignore_eos=True))
            await asyncio.wait_for(req.done.wait(), 60)
            first.finished(req)
            served_on = sorted(dep.instances)
        finally:
            await first.stop()  # the agents keep running, with the instance and its copy
        left = await _gpu_blocks(cluster)
        assert served_on and all(left[n] for n in served_on), "nothing left to clean up"

        # A load the old controller had under way: a GPU copy with no instance.
        (spare,) = [n for n in (0, 1) if n not in served_on]
        client = ClusterClient(cluster.addresses, cluster.token)
        await client.connect()
        try:
            await client.call(spare, LoadOp(model=MODEL, blocks=(0,), tier="gpu", source="remote"))
        finally:
            await client.close()

        second = Controller(cfg, cluster.addresses, cluster.token)
        await second.start()
        try:
            dep = second.deployments[MODEL]
            assert sorted(dep.instances) == served_on, "adopted where it served"
            assert await _gpu_blocks(cluster) == {**left, spare: ()}
            for node in second.nodes:
                held = second.pool.blocks_at(MODEL, node, "gpu")
                assert held == set(left[node] if node in served_on else ()), node
            # The adopted instance serves at once: no scale-out.
            ids = tok.encode("Back").ids
            req = await second.submit(dep, ids, SamplingParams(max_tokens=4, ignore_eos=True))
            await asyncio.wait_for(req.done.wait(), 60)
            assert len(req.output_token_ids) == 4
            assert dep.num_scale_outs == 0 and dep.last_start is None
        finally:
            await second.stop()

    with cluster:
        asyncio.run(run())


def test_a_pd_deployments_instances_are_adopted_and_given_their_roles(
    tmp_path, tiny_store_dir, reference
):
    """BlitzScale's P/D (§5.2): both instances adopted (no scale-out), a prefill and a decode
    one again, and a burst after the restart handed off from one to the other, token-exact."""
    tok = load_tokenizer(tiny_store_dir / "tokenizer.json")
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2)
    cfg = ControllerConfig(state_dir=state, nodes=2, tick_s=0.05)
    scaling = {"min_replicas": 2, "max_replicas": 2}
    pd = {"prefill": 1, "decode": 1}
    prompts = PROMPTS[:4]

    async def run() -> tuple[list, str]:
        first = Controller(cfg, cluster.addresses, cluster.token)
        await first.start()
        try:
            dep = await deploy(first, tiny_store_dir, "blitzscale", scaling, pd=pd)
            ready = lambda: len(dep.serving()) == 2 and not dep.multicasting  # noqa: E731
            await wait_until(ready, "two instances")
        finally:
            await first.stop()  # the agents keep both instances
        second = Controller(cfg, cluster.addresses, cluster.token)
        await second.start()
        try:
            dep = second.deployments[MODEL]
            assert len(dep.serving()) == 2 and dep.num_scale_outs == 0
            assert sorted(dep.server.pd.roles.values()) == ["decode", "prefill"]
            reqs = await run_burst(second, dep, tok, 8, prompts)
            assert dep.num_scale_outs == 0
            return reqs, second.metrics.render().decode()
        finally:
            await second.stop()

    with cluster:
        reqs, metrics = asyncio.run(run())
    check_tokens(reqs, tok, reference, 8, prompts)
    handoffs = [ln for ln in metrics.splitlines() if ln.startswith("surge_pd_handoffs_total{")]
    assert handoffs and float(handoffs[0].rsplit(" ", 1)[1]) >= 1, handoffs
