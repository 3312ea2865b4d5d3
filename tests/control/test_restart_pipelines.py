"""A restarted controller closes an execution pipeline an old one left with a stage missing
and starts the deployment again warm (docs/control.md, Restart; `policy/adoption.py`,
`policy/pipeline_adoption.py`): λScale's execution pipeline (§4: stages over several nodes'
device copies, serving while a scale-out loads) is adopted only whole
(tests/control/test_adopt_pipeline.py). Real agents: the old controller served a λScale
deployment and stopped as by a crash, its agents left running a two-stage pipeline of it
(nodes X and Y, as one caught mid scale-out) whose stage on Y is gone (closed, as by Y's
agent starting again). The new controller closes X's stage (a WARNING saying which stage is
missing), releases the device copies (host copies kept), and the instance the autoscaler
state carries is started again from the host copy (a warm start, no remote read), serving
the next request."""

import asyncio
import logging

from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.model.manifest import read_manifest
from surge.runtime.client import ClusterClient
from surge.runtime.protocol import InstanceCloseOp, LoadOp, StageCloseOp, StageOpenOp
from surge.runtime.scaleout.context import instance_name
from tests.control.strategy_run import MODEL, agent_statuses, deploy, local_cluster, wait_until

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


async def _leave_a_pipeline(cluster: object, x: int, y: int, num_blocks: int, layers: int) -> None:
    """Node `x`'s instance closed (its device copy stays) and a two-stage pipeline opened:
    layers [0, h) on `x`, the rest on `y` (its device copy pulled from the store); then
    `y`'s stage closed: the pipeline misses its last stage."""
    client = ClusterClient(cluster.addresses, cluster.token)
    await client.connect()
    try:
        await client.call(x, InstanceCloseOp(instance=instance_name(MODEL, x)))
        blocks = tuple(range(num_blocks))
        await client.call(y, LoadOp(model=MODEL, blocks=blocks, source="remote", tier="gpu"))
        h = layers // 2
        await client.call(y, StageOpenOp(pipeline="old-pipe", model=MODEL, first_layer=h,
                                         end_layer=layers))  # fmt: skip
        await client.call(x, StageOpenOp(pipeline="old-pipe", model=MODEL, first_layer=0,
                                         end_layer=h, next_node=y))  # fmt: skip
        await client.call(y, StageCloseOp(pipeline="old-pipe"))
    finally:
        await client.close()


def test_an_old_controllers_pipeline_is_closed_and_started_again_warm(
    tmp_path, tiny_store_dir, caplog
) -> None:
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2)
    cfg = ControllerConfig(state_dir=state, nodes=2, tick_s=0.05)
    manifest = read_manifest(tiny_store_dir)
    kept = {"keep_alive_s": 600, "downscale_delay_s": 600, "max_replicas": 1}

    async def run() -> tuple[dict, dict, list[str], str | None]:
        first = Controller(cfg, cluster.addresses, cluster.token)
        await first.start()
        try:
            dep = await deploy(first, tiny_store_dir, "lambdascale", kept)
            req = await first.submit(dep, [1, 2, 3], PARAMS)
            await asyncio.wait_for(req.done.wait(), 120)
            (x,) = dep.instances
        finally:
            await first.stop()  # the agents keep running
        y = 1 - x
        await _leave_a_pipeline(cluster, x, y, manifest.num_blocks, manifest.blocks[-1].end_layer)
        left = await agent_statuses(cluster)
        second = Controller(cfg, cluster.addresses, cluster.token)
        await second.start()
        try:
            after = await agent_statuses(cluster)
            dep = second.deployments[MODEL]
            await wait_until(lambda: dep.last_start is not None, "started again", 60)
            req = await second.submit(dep, [4, 5, 6], PARAMS)
            await asyncio.wait_for(req.done.wait(), 120)
            return left, after, list(req.output_token_ids), dep.last_start
        finally:
            await second.stop()

    with cluster, caplog.at_level(logging.WARNING):
        left, after, tokens, start = asyncio.run(run())
    stages = {n: [r.name for r in s.running if r.kind == "stage"] for n, s in left.items()}
    x = next(n for n, names in stages.items() if names)
    assert stages == {x: ["old-pipe"], 1 - x: []}, stages
    # the stage left closed at the start, with a WARNING saying why
    assert all(r.kind != "stage" for s in after.values() for r in s.running), after
    why = f"closing old-pipe on node {x}: a pipeline stage not adopted: a stage is missing"
    assert why in caplog.text, caplog.text
    # their device copies released, the host copy kept: started again warm
    assert all(not s.models[MODEL].gpu for s in after.values()), after
    assert any(s.models[MODEL].host for s in after.values()), after
    assert start == "warm" and len(tokens) == 4, (start, tokens)
