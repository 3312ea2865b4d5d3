"""Warm-start execution pipelines in the simulator (λScale §5 warm start, FaaScale §5).

In: a pool, one `policy.warm_pipelines.WarmGroup` of its new instances (each with the
model in its machine's host memory) and the group's block count. Each instance loads its
blocks host -> GPU one at a time in the group's order (one `fetch` per block: every GPU of
the instance its share); each block landed goes to the group's
`policy.loading.LoadingState`, and the actions are carried out as a multicast's
(`LoadingActions.carry_out` through a `Carrier`, with the runtime's opening costs): the
pipeline opens once every instance holds its segment, an instance serves alone when
whole, and the pipeline retires with its requests spread over its members. `surge serve`
carries out the same groups (`runtime/scaleout/warm.py`).
"""

import math

from surge.policy.loading import LoadingState
from surge.policy.warm_pipelines import WarmGroup, loading_settings
from surge.sim.carrier import Carrier
from surge.sim.fetch import fetch
from surge.sim.host import HostModel
from surge.sim.host_cache import HostCache
from surge.sim.instance import Instance
from surge.sim.loading_actions import LoadingActions
from surge.sim.pools import Pool


def start_warm_group(
    actions: LoadingActions,
    host: HostModel,
    cache: HostCache,
    pool: Pool,
    group: WarmGroup,
    members: list[Instance],
    num_blocks: int,
) -> None:
    """Load `members` (plan node j = `members[j]` = `group.nodes[j]`) from host memory,
    serving as the group's pipeline meanwhile."""
    world = actions.world
    loading = LoadingState(loading_settings(group, num_blocks))
    plan_nodes: list[Instance | None] = list(members)
    opened: dict[int, Instance] = {}

    def carry(action: object) -> None:
        actions.carry_out(pool, action, plan_nodes, opened)

    carrier = Carrier(world.loop, members[0].id, host.action_s, carry)
    block_bytes = math.ceil(world.models[pool.model].profile.total_bytes / num_blocks)

    def load(j: int, k: int) -> None:
        inst = members[j]
        if inst.released or k == num_blocks:
            return
        block = group.load_orders[j][k]

        def landed() -> None:
            for action in loading.arrive(j, block):
                carrier.submit(action)
            load(j, k + 1)

        fetch(world, cache, pool.model, inst.all_gpus, block_bytes, True, landed, count=k == 0)

    for j in range(len(members)):
        load(j, 0)
