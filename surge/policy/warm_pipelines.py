"""Warm-start execution pipelines: copies in host memory collaborate while they load.

λScale §5 (warm start): "λScale directly loads host-memory-cached models into GPUs for
inference execution, and before models are fully loaded, constructs an execution pipeline
across multiple nodes of this kind"; FaaScale §5: the copies collaborate. In: the
warm-local destinations of one start-up (each loads the whole model from its own host
memory into its GPU, `policy.startup` `LocalLoad(source="host")`) and the model's block
count B. Out: `WarmGroup`s. In a group of g nodes, node j loads its own contiguous
segment j of the blocks first, then the rest; once every node holds its segment the
group serves as one g-stage `Pipeline` (node j runs segment j), long before any node
holds the whole model, and when they are all whole the pipeline retires with its
requests spread over them (`policy.loading`, λScale §4.4). Groups hold at most B nodes
(one block per stage at least); a node left alone loads in layer order.

Both bodies feed each block loaded to a `policy.loading.LoadingState` built from a
group (`loading_settings`) and carry out its actions as a multicast's:
`runtime/scaleout/warm.py` (LoadOps on the agents) and `sim/warm_load.py` (host->GPU
flows). Pure and deterministic.
"""

import math
from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.loading import LoadingSettings
from surge.policy.multicast.pipelines import Pipeline
from surge.policy.multicast.stage_cover import Stage


@dataclass(frozen=True)
class WarmGroup:
    """Warm destinations that load in rotated orders and serve as one pipeline meanwhile."""

    nodes: tuple[int, ...]
    """The destinations (the caller's ids); plan node j is `nodes[j]`."""
    load_orders: tuple[tuple[int, ...], ...]
    """Per plan node: every block once, its own segment first."""
    pipeline: Pipeline
    """Plan node j runs segment j (step: the longest segment; until: all B blocks)."""


def segments(num_nodes: int, num_blocks: int) -> tuple[tuple[int, int], ...]:
    """(first, last) block of each of `num_nodes` contiguous, near-equal segments."""
    if not 1 <= num_nodes <= num_blocks:
        raise SurgeError(f"need 1 <= nodes <= blocks (got {num_nodes} nodes, {num_blocks})")
    cuts = [j * num_blocks // num_nodes for j in range(num_nodes + 1)]
    return tuple((cuts[j], cuts[j + 1] - 1) for j in range(num_nodes))


def plan_warm_groups(nodes: tuple[int, ...], num_blocks: int) -> tuple[WarmGroup, ...]:
    """The warm groups of these warm-local destinations (in their order): as few groups
    as hold at most `num_blocks` nodes each, sizes as equal as can be; none for fewer
    than two nodes or blocks."""
    if num_blocks < 1:
        raise SurgeError(f"num_blocks must be >= 1 (got {num_blocks})")
    if len(nodes) < 2 or num_blocks < 2:
        return ()
    num_groups = math.ceil(len(nodes) / num_blocks)
    cuts = [i * len(nodes) // num_groups for i in range(num_groups + 1)]
    groups = []
    for i in range(num_groups):
        members = nodes[cuts[i] : cuts[i + 1]]
        segs = segments(len(members), num_blocks)
        orders = tuple(tuple(range(first, num_blocks)) + tuple(range(first)) for first, _ in segs)
        stages = tuple(Stage(j, first, last) for j, (first, last) in enumerate(segs))
        step = max(last - first + 1 for first, last in segs)
        groups.append(WarmGroup(members, orders, Pipeline(step, stages, num_blocks)))
    return tuple(groups)


def loading_settings(group: WarmGroup, num_blocks: int) -> LoadingSettings:
    """The serve-while-loading state machine of one group: no source holds the model."""
    return LoadingSettings(
        num_nodes=len(group.nodes),
        num_blocks=num_blocks,
        num_sources=0,
        pipelines=(group.pipeline,),
        mode="pipelines",
    )
