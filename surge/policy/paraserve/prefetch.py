"""ParaServe's node prefetcher (§5, Fig. 6(b)) and its fetch priority (§4.2).

In: a pipeline group (`group_plan.GroupPlan`'s members and parts), the model's block
count, each member's own tier, the system's consolidation mode and the §6.1 predictor's
number of workers to keep as the group starts. Out: one `MemberPrefetch` per member, which
both bodies carry out (`runtime/scaleout/paraserve.py`, `sim/groups.py`).

ParaServe §5: a prefetcher on each GPU server fetches the model for a cold-start worker
into host (shared) memory as soon as the worker is placed, and "downloads two parts of
model sequentially" (Fig. 6(b)): the worker's own part, on the critical path of the
group's first token, then the rest, in the background, which the parameter manager loads
into the GPU when the worker consolidates into a standalone one (§6). So a kept member's
rest is already on the server when consolidation starts, and comes in over PCIe instead of
the network. Which members fetch the rest early: every member under `scale-up` (all stay),
the first `predicted_keep` members under `predictor` (§6.1 keeps a group's first members;
the prediction is the sliding window as the group starts; a member kept later fetches its
rest then). A member whose own tier is its host copy prefetches nothing: it is there.

§4.2: fetching and inference share a server's NIC; "because the intermediate results are
small, simply prioritizing inference packets solves the contention". The background part
of a prefetch is `BACKGROUND` traffic: it only takes bandwidth that inference packets leave
(`runtime/token_bucket.py`); the own part is `CRITICAL` (nothing serves before it).
Owned by policy/paraserve.
"""

from dataclasses import dataclass
from typing import Literal

from surge.errors import SurgeError

Priority = Literal["critical", "background"]
CRITICAL: Priority = "critical"
BACKGROUND: Priority = "background"


@dataclass(frozen=True)
class MemberPrefetch:
    """What one member's node prefetcher fetches, in order."""

    node: int
    own: tuple[int, ...]
    """Its part: fetched first, on the critical path (`CRITICAL`), into its GPU."""
    rest: tuple[int, ...]
    """The other blocks, fetched into the node's host tier right after `own`, as
    `BACKGROUND` traffic (empty: it fetches the rest only if consolidation keeps it)."""


def plan_prefetch(
    members: tuple[int, ...],
    parts: tuple[tuple[int, ...], ...],
    num_blocks: int,
    own_tiers: tuple[str, ...],
    consolidation: str,
    predicted_keep: int,
) -> tuple[MemberPrefetch, ...]:
    """Each member's prefetch (see the module docstring). `consolidation` is the system's
    mode (`scale-up`, `predictor`, `none`); `predicted_keep` the §6.1 predictor's number
    of workers to keep, as the group starts."""
    if not (len(members) == len(parts) == len(own_tiers)):
        raise SurgeError("plan_prefetch: one part and one own tier per member")
    if predicted_keep < 0:
        raise SurgeError(f"plan_prefetch: predicted_keep must be >= 0 (got {predicted_keep})")
    if consolidation == "scale-up":
        early = len(members)
    elif consolidation == "predictor":
        early = min(predicted_keep, len(members))
    else:  # nobody consolidates: nothing beyond the parts is needed
        early = 0
    if len(members) == 1:
        early = 0  # a single worker's part is the whole model
    out = []
    for i, (node, part, tier) in enumerate(zip(members, parts, own_tiers, strict=True)):
        rest = tuple(b for b in range(num_blocks) if b not in part)
        fetch_rest = i < early and tier != "host"
        out.append(MemberPrefetch(node, tuple(part), rest if fetch_rest else ()))
    return tuple(out)
