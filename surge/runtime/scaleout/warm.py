"""Warm-start execution pipelines in `surge serve` (λScale §5 warm start, FaaScale §5).

In: the context and one `policy.warm_pipelines.WarmGroup`: destinations that each hold
the model in their own host memory. Each node loads its blocks host -> GPU one at a time
in the group's order (its own segment first, `LoadOp` per block); every block loaded goes
to the group's `policy.loading.LoadingState`, whose actions are carried out as a
multicast's (`multicast.LoadingCarrier`): the group's pipeline opens once every node holds
its segment and serves while the rest loads, each node opens its local instance when
whole, and the pipeline retires with its requests spread over its members (λScale §4.4).
The simulator carries out the same groups (`sim/warm_load.py`). Out: endpoints opened
and retired, recorded on the context.
"""

import asyncio
import logging
import secrets

from surge.policy.loading import LoadingState
from surge.policy.warm_pipelines import WarmGroup, loading_settings
from surge.runtime.scaleout.context import ScaleOutContext
from surge.runtime.scaleout.local import load_blocks
from surge.runtime.scaleout.multicast import LoadingCarrier

log = logging.getLogger(__name__)


async def run_warm_group(ctx: ScaleOutContext, group: WarmGroup) -> None:
    """Load the group's nodes from their host memory, serving as its pipeline meanwhile."""
    state = LoadingState(loading_settings(group, ctx.manifest.num_blocks))
    agents = list(group.nodes)
    carrier = LoadingCarrier(ctx, agents, f"warm{secrets.token_hex(3)}", None)
    in_order = asyncio.Lock()  # one arrival's actions at a time, as a multicast's

    async def load(j: int) -> None:
        for block in group.load_orders[j]:
            await load_blocks(ctx, agents[j], [block], "host")
            log.debug("warm group: block %d on node %d", block, agents[j])
            async with in_order:
                for action in state.arrive(j, block):
                    await carrier.carry_out(action)

    try:
        await asyncio.gather(*(load(j) for j in range(len(agents))))
    finally:  # a member failed before completing: its pipeline's requests move on
        for index in list(carrier.names):
            await carrier.retire(index)
