"""FlexPipe's serving groups: what each should carry, and which to re-cut.

In: the groups as the refactoring decision sees them (`GroupView`: stages, requests, whether
a refactoring is under way), the requests waiting at the router, the autoscaler's settings
and a `FlexPipeSettings`. Out:
- `pipeline_autoscale` / `pipeline_target`: the autoscaler's per-pipeline target and what
  the `pack` router (`policy.router`) fills a group up to (η micro-batches for η stages);
- `group_refactors`: which serving groups to re-cut and to how many stages (split under a
  queue to `system.split_stages`, merge to what holds their load when none waits).
The controller's granularity loop (`control/flexpipe.py`) and the simulator
(`sim/flexpipe.py`) both call these. Pure and deterministic.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace

from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.flexpipe.settings import FlexPipeSettings


def pipeline_autoscale(base: AutoscaleSettings, num_stages: float) -> AutoscaleSettings:
    """The autoscaler's settings for pipelines of `num_stages` stages (their mean): a
    pipeline of η stages with η micro-batches in flight serves the sum of its stages'
    throughputs (§7 Eq. 12, Σ_k μ_jk), so it takes η times an instance's target of
    ongoing requests; counted as one instance it would be scaled out η times too often."""
    return replace(base, target_ongoing_requests=pipeline_target(base, num_stages))


@dataclass(frozen=True)
class GroupView:
    """One serving pipeline group as the refactoring decision sees it."""

    group_id: int
    """Stable id; the lowest is the one a `pack` router fills first among idle ones."""
    num_stages: int
    """Its stages now."""
    outstanding: int
    """Requests queued at or running on it."""
    refactoring: bool = False
    """A refactoring of it is under way."""


@dataclass(frozen=True)
class Recut:
    """One serving group to re-cut."""

    group_id: int
    num_stages: int
    """Its stages after the refactoring."""


def group_refactors(
    groups: Sequence[GroupView],
    finest_stages: int,
    queued: int,
    base: AutoscaleSettings,
    settings: FlexPipeSettings,
) -> tuple[Recut, ...]:
    """§6 / §7 Fig. 7: the serving groups to re-cut, in `groups` order. `finest_stages` is
    Eq. 4's choice for the arrivals' CV, at most `useful_stages`.
    - Split: while requests wait at the router (`queued` > 0: every group is past its
      target, `policy.router` `pack`), a busy group coarser than `finest_stages` splits to
      it: more stages on more GPUs, each loading a slice, take more requests at once.
    - Merge: while none waits, a busy group finer than the coarsest stage count whose
      `pipeline_target` holds its requests merges to that ("after traffic changes, it
      modifies to a coarser granularity pipeline stage with fewer additional overheads",
      Fig. 7): fewer hops for every step, and the GPUs it frees go back; what its retired
      micro-batches hold joins the ones that stay (`merge.adoptions`). Not with
      `settings.merge_busy_groups` False (a counterfactual).
    - An idle group is draining (the `pack` router sends it nothing; the autoscaler
      releases it) and is left as it is, unless every group is idle: the one the router
      fills next (the lowest id) merges to the coarsest, as it serves the next request.
    A group being refactored is left alone."""
    counts = sorted(settings.stage_counts)

    def holding(outstanding: int) -> int:
        fits = [c for c in counts if pipeline_target(base, c) >= outstanding]
        return fits[0] if fits else counts[-1]

    idle = [g.group_id for g in groups if g.outstanding == 0]
    next_up = min(idle) if idle and len(idle) == len(groups) else None
    out = []
    for g in groups:
        if g.refactoring:
            continue
        if g.group_id == next_up and g.num_stages > counts[0]:
            out.append(Recut(g.group_id, counts[0]))
        elif g.outstanding == 0:
            continue
        elif queued > 0 and g.num_stages < finest_stages:
            out.append(Recut(g.group_id, finest_stages))
        elif queued == 0 and holding(g.outstanding) < g.num_stages and settings.merge_busy_groups:
            out.append(Recut(g.group_id, holding(g.outstanding)))
    return tuple(out)


def pipeline_target(base: AutoscaleSettings, num_stages: float) -> float:
    """Requests one pipeline of `num_stages` stages should carry (`pipeline_autoscale`'s
    target): what a `pack` router fills it up to (`policy.router`). Computed without
    building the settings: `group_refactors` asks for every group at every decision."""
    return base.target_ongoing_requests * max(1.0, num_stages)
