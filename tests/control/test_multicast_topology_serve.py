"""Through the controller (issue 17): a blitzscale P/D deployment scales out from its two
serving instances, and the prefill one — whose egress carries K/V to decode (BlitzScale
§5.1) — sends no block: the controller reports what each egress carries, the runtime's
planner prunes it, and the agents' arrival events show every block came from the decode
instance. Without the egress facts, start-up would send from the least loaded copy: the
prefill one, whose requests have moved on to decode."""

import asyncio

from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.policy.blitzscale.pd import DECODE, PREFILL
from surge.runtime.protocol import BlockArrived
from surge.runtime.scaleout.context import instance_name
from tests.control.strategy_run import deploy, local_cluster, wait_until
from tests.control.test_serve_openai import MODEL


def test_the_prefill_source_sends_nothing_to_a_new_instance(tmp_path, tiny_store_dir) -> None:
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=3, link_gbps=0.2)
    params = SamplingParams(max_tokens=200, ignore_eos=True)

    async def run() -> tuple[dict[str, int], set[int], int]:
        ctl = Controller(
            ControllerConfig(state_dir=state, nodes=3), cluster.addresses, cluster.token
        )
        await ctl.start()
        try:
            # requests in flight drive the scale-out here (BlitzScale's own monitor, §5.3,
            # counts prompt tokens against a profiled bound: `count_in_flight` opts back in)
            scaling = {
                "min_replicas": 2,
                "max_replicas": 3,
                "target_ongoing_requests": 1,
                "count_in_flight": True,
            }
            dep = await deploy(
                ctl, tiny_store_dir, "blitzscale", scaling, pd={"prefill": 1, "decode": 1}
            )
            await wait_until(
                lambda: len(dep.serving()) == 2 and not dep.multicasting, "two instances"
            )
            pd = dep.server.pd
            assert pd is not None
            node_of = {instance_name(MODEL, i.node): i.node for i in dep.serving()}
            roles = {role: node_of[name] for name, role in pd.roles.items()}
            arrivals = ctl.client.subscribe((BlockArrived,), model=MODEL)
            # Two long requests move on to decode; then a third (a target of one each) asks
            # for a third instance while the prefill copy is the least loaded one.
            reqs = [await ctl.submit(dep, [1, 2, 3, 4], params) for _ in range(2)]
            await wait_until(lambda: pd.num_handoffs == 2, "both requests on decode")
            reqs.append(await ctl.submit(dep, [1, 2, 3, 4], params))
            await wait_until(lambda: len(dep.serving()) == 3 and not dep.multicasting, "a third")
            await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs)), 120)
            new = next(n for n in dep.instances if n not in roles.values())
            got = [arrivals.get_nowait() for _ in range(arrivals.qsize())]
            srcs = {e.src for e in got if isinstance(e, BlockArrived) and e.node == new and e.mc_id}
            return roles, srcs, pd.num_mutations
        finally:
            await ctl.stop()

    with cluster:
        roles, srcs, mutations = asyncio.run(run())
    assert mutations == 0  # the prefill instance stayed prefill while the plan was made
    assert set(roles) == {PREFILL, DECODE}
    assert srcs == {roles[DECODE]}, (roles, srcs)
