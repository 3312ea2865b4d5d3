"""The JSON form of a planned scale-out (what `surge plan multicast --json` prints).

In: a `MulticastOutcome`.
Out: a plain dict of exactly the shape issue 3 specifies:
{"strategy", "nodes", "blocks", "sources", "steps": [[{"src","dst","block"}...]...],
 "complete_step", "pipelines": [{"step", "stages": [{"node", "blocks": [first, last]}]}],
 "timeline": {"complete_s", "first_pipeline_s", "optimal_s"}}
Steps and pipeline steps count from 1 (steps[0] is step 1).
"""

from typing import Any

from surge.policy.multicast.scale_out import MulticastOutcome


def outcome_to_json(outcome: MulticastOutcome) -> dict[str, Any]:
    """The JSON-ready dict of `outcome`."""
    plan, timeline = outcome.plan, outcome.timeline
    return {
        "strategy": plan.strategy,
        "nodes": plan.num_nodes,
        "blocks": plan.num_blocks,
        "sources": plan.num_sources,
        "steps": [
            [{"src": t.src, "dst": t.dst, "block": t.block} for t in step] for step in plan.steps
        ],
        "complete_step": plan.complete_step,
        "pipelines": [
            {
                "step": p.step,
                "stages": [
                    {"node": s.node, "blocks": [s.first_block, s.last_block]} for s in p.stages
                ],
            }
            for p in outcome.pipelines
        ],
        "timeline": {
            "complete_s": timeline.complete_s,
            "first_pipeline_s": timeline.first_pipeline_s,
            "optimal_s": timeline.optimal_s,
        },
    }
