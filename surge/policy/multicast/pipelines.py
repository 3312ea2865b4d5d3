"""Execution pipelines that serve while the model is still arriving.  # λScale §4.3-§4.4

In: a validated `Plan` (and, for λScale Alg. 2, the sub-groups of a k-way multicast).
Out: the `Pipeline`s in the order they form: from the end of `step` a set of
destinations that together hold every block runs the model, each node one contiguous
stage in layer order, until `until_step`, when one of its nodes holds every block and
switches to local mode (λScale §4.4), which dissolves the pipeline.

Two generators:
- `pipelines_kway` (λScale Alg. 2): the pipelines are fixed up front, one node from
  each sub-group (the t-th destination of every sub-group), leftovers of a single
  sub-group together; each forms at the first step its nodes cover all blocks.
- `pipelines_earliest` (any plan): at every step, among destinations that are neither
  complete nor in a live pipeline, form as many disjoint fewest-stage covers as the
  greedy search finds (`find_stage_cover`). Nodes of a dissolved pipeline are free again.
Sources are never stages: they already serve a whole copy.

Speed (issue 12): holdings are one (N, B) arrival matrix; the search starts at the
first step at which the destinations between them hold every block, and a step is
searched only if a free node received a block or a pipeline dissolved since the last
search that found nothing (the same inputs give the same None); a plan whose every
destination receives its blocks in layer order (chain, binary tree, naive) holds only
prefixes, so no set of incomplete nodes covers every block and it forms no pipeline.
"""

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from surge.errors import SurgeError
from surge.policy.multicast.plan import Plan, PlanInvariantError, arrival_matrix
from surge.policy.multicast.stage_cover import CoverIndex, Stage, search_cover


@dataclass(frozen=True)
class PipelineSettings:
    """Limits of pipeline generation. Validated at construction."""

    max_stages: int | None = None
    """Most nodes in one pipeline; None = no limit (fewest stages are always preferred)."""
    max_search_states: int = 5000
    """Search budget of one cover search; past it the step forms no further pipeline."""

    def __post_init__(self) -> None:
        if self.max_stages is not None and self.max_stages < 2:
            raise SurgeError(f"max_stages must be >= 2 or None (got {self.max_stages})")
        if self.max_search_states < 1:
            raise SurgeError(f"max_search_states must be >= 1 (got {self.max_search_states})")


@dataclass(frozen=True)
class Pipeline:
    """An execution pipeline: usable from the end of `step` up to the end of `until_step`."""

    step: int
    """Step at whose end every stage's node holds its blocks (numbered from 1)."""
    stages: tuple[Stage, ...]
    """Stages in layer order; together they run blocks 0..B-1 once each."""
    until_step: int
    """Step at whose end a stage's node first holds every block (mode switch)."""

    @property
    def nodes(self) -> tuple[int, ...]:
        """The nodes running this pipeline, in stage order."""
        return tuple(s.node for s in self.stages)


def _receives_in_layer_order(arrival: np.ndarray, num_sources: int) -> bool:
    """True if every destination gets block i+1 no earlier than block i.

    Then at every step each destination holds a prefix 0..j; the longest prefix among
    incomplete nodes misses block j+1 and nobody else holds it, so no cover exists.
    """
    return bool(np.all(arrival[num_sources:, 1:] >= arrival[num_sources:, :-1]))


def _index_at(arrival: np.ndarray, nodes: np.ndarray, step: int) -> CoverIndex:
    return CoverIndex(nodes.tolist(), arrival[nodes] <= step)


def pipelines_earliest(
    plan: Plan, settings: PipelineSettings | None = None
) -> tuple[Pipeline, ...]:
    """Greedy earliest disjoint covers at every step (general case of λScale §4.3)."""
    settings = settings or PipelineSettings()
    arrival = arrival_matrix(plan)
    if _receives_in_layer_order(arrival, plan.num_sources):
        return ()
    completion = arrival.max(axis=1)
    arrays = plan.arrays
    starts = arrays.step_starts.tolist()
    is_destination = np.arange(plan.num_nodes) >= plan.num_sources
    busy = np.zeros(plan.num_nodes, dtype=bool)  # in a live pipeline
    formed: list[Pipeline] = []
    live: list[Pipeline] = []
    # Free nodes when the last search found nothing (the first search always runs).
    settled = np.ones(plan.num_nodes, dtype=bool)
    # Until the step at which the destinations between them hold every block, no set
    # of them covers the blocks: nothing forms, so the search starts there.
    first_covered = max(1, int(arrival[plan.num_sources :].min(axis=0).max()))
    for step in range(first_covered, plan.complete_step + 1):
        dissolved = [p for p in live if p.until_step <= step]
        live = [p for p in live if p.until_step > step]
        for p in dissolved:
            busy[list(p.nodes)] = False
        received = arrays.dst[starts[step - 1] : starts[step]]
        if not dissolved and not settled[received].any():
            continue  # same free nodes, same holdings: the search would find nothing again
        free = np.flatnonzero(is_destination & (completion > step) & ~busy)
        held = arrival[free] <= step
        if len(free) >= 2 and held.any(axis=0).all():
            index = CoverIndex(free.tolist(), held)
            free_left = len(free)
            while free_left >= 2:
                stages = search_cover(
                    index, plan.num_blocks, settings.max_stages, settings.max_search_states
                )
                if stages is None:
                    break
                pipeline = Pipeline(step, stages, int(min(completion[s.node] for s in stages)))
                formed.append(pipeline)
                live.append(pipeline)
                busy[list(pipeline.nodes)] = True
                index.drop(pipeline.nodes)
                free_left -= len(stages)
        settled[:] = is_destination & (completion > step) & ~busy
    result = tuple(formed)
    validate_pipelines(plan, result)
    return result


def kway_pipeline_groups(subgroups: Sequence[Sequence[int]]) -> list[list[int]]:
    """Node groups of λScale Alg. 2 over the destinations of each sub-group.

    While >= 2 sub-groups have unassigned nodes, take a = the fewest left in any of them
    and form a groups, the t-th taking the t-th unassigned node of every such sub-group;
    when one sub-group is left, its remaining nodes form one group.  # λScale §4.3, Alg. 2
    """
    left = [list(group[1:]) for group in subgroups]
    groups: list[list[int]] = []
    while True:
        open_groups = [g for g in left if g]
        if not open_groups:
            return groups
        if len(open_groups) == 1:
            groups.append(list(open_groups[0]))
            open_groups[0].clear()
            continue
        a = min(len(g) for g in open_groups)
        for t in range(a):
            groups.append([g[t] for g in open_groups])
        for g in open_groups:
            del g[:a]


def pipelines_kway(
    plan: Plan,
    subgroups: Sequence[Sequence[int]],
    settings: PipelineSettings | None = None,
) -> tuple[Pipeline, ...]:
    """Pipelines of λScale Alg. 2: each fixed group forms at its earliest covering step."""
    return pipelines_of_groups(plan, kway_pipeline_groups(subgroups), settings)


def pipelines_of_groups(
    plan: Plan,
    groups: Sequence[Sequence[int]],
    settings: PipelineSettings | None = None,
) -> tuple[Pipeline, ...]:
    """One pipeline per fixed node group, formed at the group's earliest covering step
    (λScale Alg. 2's groups, or one group per local replica: §4.3 Case 3, Fig. 6c)."""
    settings = settings or PipelineSettings()
    arrival = arrival_matrix(plan)
    completion = arrival.max(axis=1)
    formed: list[Pipeline] = []
    for group in groups:
        nodes = np.asarray(group, dtype=np.int64)
        # Before every block is somewhere in the group no cover exists: start there,
        # unless fewer than two incomplete nodes are left by then (nothing forms).
        first = max(1, int(arrival[nodes].min(axis=0).max()))
        if first > 1 and np.count_nonzero(completion[nodes] > first - 1) < 2:
            continue
        for step in range(first, plan.complete_step + 1):
            candidates = nodes[completion[nodes] > step]
            if len(candidates) < 2:
                break
            stages = search_cover(
                _index_at(arrival, np.sort(candidates), step),
                plan.num_blocks,
                settings.max_stages,
                settings.max_search_states,
            )
            if stages is not None:
                until = int(min(completion[s.node] for s in stages))
                formed.append(Pipeline(step, stages, until))
                break
    formed.sort(key=lambda p: (p.step, p.nodes))
    result = tuple(formed)
    validate_pipelines(plan, result)
    return result


def validate_pipelines(plan: Plan, pipelines: Sequence[Pipeline]) -> None:
    """Raise `PlanInvariantError` unless every pipeline is valid for `plan`.

    Valid: stages contiguous, in layer order, covering 0..B-1; each stage's node a
    destination that holds its blocks at `step` and is not yet complete; `until_step`
    is when a stage node completes; pipelines live at the same step share no node.
    """
    if not pipelines:
        return
    arrival = arrival_matrix(plan)
    completion = arrival.max(axis=1).tolist()
    for p in pipelines:
        if len(p.stages) < 2:
            raise PlanInvariantError(f"pipeline {p} has fewer than two stages")
        expected_first = 0
        for s in p.stages:
            if s.first_block != expected_first or s.last_block < s.first_block:
                raise PlanInvariantError(f"pipeline {p}: stages not contiguous in layer order")
            if s.node < plan.num_sources:
                raise PlanInvariantError(f"pipeline {p}: source {s.node} used as a stage")
            if arrival[s.node, s.first_block : s.last_block + 1].max() > p.step:
                raise PlanInvariantError(f"pipeline {p}: node {s.node} lacks its blocks")
            if completion[s.node] <= p.step:
                raise PlanInvariantError(f"pipeline {p}: node {s.node} is already complete")
            expected_first = s.last_block + 1
        if expected_first != plan.num_blocks:
            raise PlanInvariantError(f"pipeline {p}: stages do not cover every block")
        if len(set(p.nodes)) != len(p.nodes):
            raise PlanInvariantError(f"pipeline {p}: a node runs two stages")
        if p.until_step != min(completion[n] for n in p.nodes):
            raise PlanInvariantError(f"pipeline {p}: until_step is not the first mode switch")
    _check_live_pipelines_disjoint(plan.complete_step, pipelines)


def _check_live_pipelines_disjoint(num_steps: int, pipelines: Sequence[Pipeline]) -> None:
    """No node in two pipelines live at one step of 1..S (live: step <= t < until_step).

    Per node, its pipelines' live intervals sorted by start must not overlap; only on
    an overlap are the steps walked one by one, to name the first shared step.
    """
    intervals: dict[int, list[tuple[int, int]]] = {}
    for p in pipelines:
        first, stop = max(p.step, 1), min(p.until_step, num_steps + 1)
        if first < stop:
            for node in p.nodes:
                intervals.setdefault(node, []).append((first, stop))
    for spans in intervals.values():
        spans.sort()
        if any(first < stop for (_, stop), (first, _) in itertools.pairwise(spans)):
            break
    else:
        return
    for step in range(1, num_steps + 1):
        seen: set[int] = set()
        for p in pipelines:
            if p.step <= step < p.until_step:
                if seen & set(p.nodes):
                    raise PlanInvariantError(f"pipelines live at step {step} share a node")
                seen |= set(p.nodes)
