"""Which idle instances a P/D deployment lets go (BlitzScale §2.1, §4, §6.1).

In: the autoscaler's release (`policy.autoscale.decide`: idle instances, longest idle
first) as indices of the deployment's `pd.PdInstance`s, and those instances. Out:
`releasable`, the release less what would leave the instances that stay without a prefill
or a decode instance: while a P/D deployment keeps any instance it keeps one of each role,
the one of the missing role that idled least long staying. Releasing them all (scale to
zero) is untouched.

Why: P/D "uses two replicas of the same model to serve the prefill and decode phases of a
request, respectively" (§2.1), "at least two serving instances, a prefill and a decode"
(§4 C#1), and §6.1 runs every workload so. The autoscaler counts instances, not roles
(`pd.serving_floor`): on §6.1's 7B run ServerlessLLM released its four idle decode
instances (with two idle prefill ones) while its two busy prefill instances stayed, and
their next request, with no decode instance serving or loading, decoded on its prefill
instance (`handoff.handoff_target`'s fallback); a pool left with decode instances alone
prefills and decodes whole requests on them (`pd.routable`'s fallback).

Pure and deterministic. Both bodies carry it out on every release: the simulator
(`sim/scaling.py` through `sim/pd.PdPool.releasable`) and `surge serve`
(`control/autoscaler.py` through `runtime/migration/pd_handoff.PdServing.releasable`).
"""

from collections.abc import Sequence

from surge.policy.blitzscale.pd import ROLES, PdInstance


def releasable(release: Sequence[int], instances: Sequence[PdInstance]) -> tuple[int, ...]:
    """Of `release` (indices into `instances`' `index`, the autoscaler's order), those to
    release: all of them, but for each role none of the instances that stay holds, the last
    released instance of that role (the one idle least long) stays, unless none stays at
    all. An index without an instance in `instances` (no role) is released as asked."""
    role_of = {i.index: i.role for i in instances}
    out = list(release)
    gone = set(out)
    if all(i.index in gone for i in instances):
        return tuple(out)
    for role in ROLES:
        if any(i.role == role and i.index not in gone for i in instances):
            continue
        of_role = [k for k in out if role_of.get(k) == role]
        if of_role:
            out.remove(of_role[-1])
    return tuple(out)
