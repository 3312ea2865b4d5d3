"""Independent replay of plans for tests: re-checks the step model without trusting
`surge.policy.multicast.plan.validate_plan`.

In: a `Plan` (and pipelines). Out: assertion errors naming the broken rule, or the
per-node arrival steps.
"""

from surge.policy.multicast.pipelines import Pipeline
from surge.policy.multicast.plan import Plan


def replay(plan: Plan) -> list[dict[int, int]]:
    """Assert the step model holds; return arrival[node][block] = step (0 on sources)."""
    n, b, k = plan.num_nodes, plan.num_blocks, plan.num_sources
    arrival: list[dict[int, int]] = [
        dict.fromkeys(range(b), 0) if node < k else {} for node in range(n)
    ]
    for step, transfers in enumerate(plan.steps, start=1):
        srcs = [t.src for t in transfers]
        dsts = [t.dst for t in transfers]
        assert len(srcs) == len(set(srcs)), f"step {step}: a node sends twice"
        assert len(dsts) == len(set(dsts)), f"step {step}: a node receives twice"
        for t in transfers:
            assert arrival[t.src].get(t.block, step) < step, f"step {step}: {t} not held"
        for t in transfers:
            arrival[t.dst].setdefault(t.block, step)
    for node in range(n):
        assert sorted(arrival[node]) == list(range(b)), f"node {node} misses blocks"
    return arrival


def assert_pipelines_valid(plan: Plan, pipelines: tuple[Pipeline, ...]) -> None:
    """Stages contiguous, in layer order, cover all blocks, held at `step`; live ones disjoint."""
    arrival = replay(plan)
    complete = [max(a.values()) for a in arrival]
    for p in pipelines:
        assert len(p.stages) >= 2
        covered = [blk for s in p.stages for blk in range(s.first_block, s.last_block + 1)]
        assert covered == list(range(plan.num_blocks)), f"{p} does not cover in order"
        for s in p.stages:
            assert s.node >= plan.num_sources
            assert all(
                arrival[s.node][blk] <= p.step for blk in range(s.first_block, s.last_block + 1)
            )
            assert complete[s.node] > p.step, "a complete node left for local mode"
        assert p.until_step == min(complete[s.node] for s in p.stages)
    for step in range(1, plan.complete_step + 1):
        live = [node for p in pipelines if p.step <= step < p.until_step for node in p.nodes]
        assert len(live) == len(set(live)), f"pipelines live at step {step} share a node"
