"""ParaServe's groups of one scale-out (§4.1, §6.1): which workers form each group.

In: the group sizing (`SystemConfig.group_sizing`: `fixed` or `alg1`), the wanted group
size (`pipeline_size`), the model's block bytes, and the candidate workers in the caller's
order; for `alg1` also Alg. 1/Alg. 2's request (`policy.paraserve.group_plan.GroupRequest`). Out: a
`GroupPlan` (members in stage order, each one's blocks), or None when no worker is free.
- `fixed_group`: the first `pipeline_size` candidates (no more than the blocks); fewer
  when fewer are free, down to one. Alg. 1's own rule when it has no answer is the
  smallest group, one worker ("Use single worker if no solution", ParaServe §4.1.1
  Alg. 1's last line): a cold start with fewer workers beats none.
- `choose_group`: `fixed` -> `fixed_group`; `alg1` -> `policy.paraserve.group_plan.plan_group`, and
  when Alg. 1 finds no group (no server fits even a part), `fixed_group` on the
  candidates (the same fallback).
- `plan_groups`: one group per leader (a scale-out's destination) on a pool of one-worker
  servers: each group's members leave the pool, Alg. 2's state carries the earlier
  groups' workers; a leader an earlier group took is replaced by the next free server;
  the first group that cannot form ends the scale-out (fewer instances now; the
  autoscaler asks again).
`surge serve` (`runtime/scaleout/paraserve.py`) calls `plan_groups`; the simulator
(`sim/groups.py`, several workers per machine and GPU shares) calls `plan_group` and
`fixed_group` for each group in turn and stops at the first that cannot start.
`tests/parity/test_paraserve_groups_parity.py` proves the bodies form the same groups.
Pure.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from surge.policy.paraserve.group_plan import GroupPlan, GroupRequest, plan_group, split_blocks
from surge.policy.paraserve.sizing import GpuServer, SizingDecision

SIZINGS = ("fixed", "alg1")


def fixed_group(
    candidates: Sequence[int], block_bytes: tuple[int, ...], pipeline_size: int
) -> GroupPlan | None:
    """The first `pipeline_size` candidates (no more than the blocks), fewer when fewer
    are free; parts split by bytes. None when no candidate is free."""
    size = min(pipeline_size, len(block_bytes), len(candidates))
    if size < 1:
        return None
    members = tuple(candidates[:size])
    decision = SizingDecision(size, 0, (), members, math.nan, math.nan, False)
    return GroupPlan(members, split_blocks(block_bytes, size), decision, ())


def choose_group(
    sizing: str,
    candidates: Sequence[int],
    block_bytes: tuple[int, ...],
    pipeline_size: int,
    alg1: GroupRequest | None = None,
) -> GroupPlan | None:
    """One group: `fixed`, or Alg. 1 (`alg1`, whose request must then be given) with the
    fixed group as its fallback."""
    if sizing not in SIZINGS:
        raise ValueError(f"group sizing must be one of {SIZINGS} (got {sizing!r})")
    if sizing == "alg1":
        if alg1 is None:
            raise ValueError("alg1 sizing needs Alg. 1's request")
        group = plan_group(alg1) if alg1.servers else None
        if group is not None:
            return group
    return fixed_group(candidates, block_bytes, pipeline_size)


@dataclass(frozen=True)
class GroupsRequest:
    """The groups of one scale-out on servers that each take one worker."""

    leaders: tuple[int, ...]
    """One group per leader, in order (the scale-out's destinations); a leader comes first
    in its group's candidates while it is free."""
    spares: tuple[int, ...]
    """Other free servers a group may take, in order."""
    sizing: str
    pipeline_size: int
    alg1: GroupRequest
    """Alg. 1/Alg. 2's request for every server in the pool (`leaders` + `spares`, in that
    order); each group sees only the servers still free, and the networks the earlier
    groups left. Its `model_id` prefixes each group's (`<model_id>/<group>`)."""


def plan_groups(request: GroupsRequest) -> tuple[GroupPlan, ...]:
    """The groups, one per leader, until one cannot form (see the module docstring)."""
    pool = [*request.leaders, *request.spares]
    by_id: dict[int, GpuServer] = {s.server_id: s for s in request.alg1.servers}
    networks = request.alg1.networks
    groups: list[GroupPlan] = []
    taken: set[int] = set()
    for leader in request.leaders:
        first = [] if leader in taken else [leader]
        free = [*first, *[n for n in pool if n != leader and n not in taken]]
        alg1 = replace(
            request.alg1,
            servers=tuple(by_id[n] for n in free if n in by_id),
            networks=networks,
            model_id=f"{request.alg1.model_id}/{len(groups)}",
        )
        group = choose_group(
            request.sizing, free, request.alg1.block_bytes, request.pipeline_size, alg1
        )
        if group is None:
            break
        groups.append(group)
        taken.update(group.members)
        if group.networks:
            networks = group.networks
    return tuple(groups)
