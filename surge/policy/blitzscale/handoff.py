"""Where a P/D deployment's prefilled request decodes (BlitzScale §2.1, §5.2, §6.1).

In: the serving instances of one P/D deployment as `pd.PdInstance`s, the instance that
prefilled the request, and whether a decode instance is on its way (`decode_joining`:
instances still loading that will join as decode instances, by `pd.role_for_new`). Out:
- `decodes_where_prefilled`: whether an instance of a role keeps the requests it prefilled
  (every role but prefill);
- `handoff_target`: the decode instance that adopts a finished prefill's K/V (the least
  loaded with room, requests per capacity, ties to the oldest), or None while it waits:
  every decode instance is full (the back-pressure that shows decode is the bottleneck),
  or none serves yet but one is loading. Only a deployment with no decode instance,
  serving or on its way (one held to a single instance), decodes in place;
- `decode_joining` / `prefill_joining`: whether one of the instances still loading will
  join as a decode / prefill one (`joining_roles`, `pd.role_for_new` in join order).

Why a request waits for a decode instance that is still loading rather than decoding on
its prefill instance: P/D "uses two replicas of the same model to serve the prefill and
decode phases of a request, respectively" (§2.1); "it uses at least two serving
instances, a prefill and a decode" (§4 C#1); "for all the workload, we run with prefill
and decode disaggregation" (§6.1). A decode instance cannot serve before it has loaded:
"live scaling a decode instance in P/D disaggregation is impossible due to the incast
nature of both parameter load and KVCache transfer" (§5.2), and a prefill instance that
decodes is a P-D colocated instance, whose live scaling the paper leaves "for future
work" (§5.2). So the K/V stays parked on its prefill instance until the decode instance
serves (the decode phase is what it waits for; its first token is out already).

Pure and deterministic. Both bodies carry it out: `surge serve`
(`runtime/migration/pd_handoff.py`) and the simulator (`sim/pd.py`, `sim/pools.py`);
`tests/parity/test_pd_parity.py` proves they hand off (or wait) alike.
"""

from collections.abc import Sequence
from dataclasses import replace

from surge.policy.blitzscale.pd import DECODE, PREFILL, PdInstance, PdLoad, PdTargets, role_for_new


def decodes_where_prefilled(role: str | None) -> bool:
    """Whether an instance of `role` (None: no P/D) decodes the requests it prefilled, their
    K/V staying where it is: every role but prefill. A prefill instance parks them for a
    decode instance (§5.2); a decode instance that prefills keeps them — the source of a
    BlitzScale live batch (§4), which ran the batch's last layers and holds their K/V (only
    the new instance's first layers' part has to reach it)."""
    return role != PREFILL


def joining_roles(
    load: PdLoad, targets: PdTargets, joining: int, mutation: bool
) -> tuple[str, ...]:
    """The roles `joining` instances still loading take as they join in order, holding
    nothing (`role_for_new` on the deployment as `load` shows it; `mutation`: the system
    mutates prefill instances)."""
    instances = list(load.instances)
    capacity = max((i.capacity for i in instances), default=1)
    roles: list[str] = []
    for k in range(joining):
        role = role_for_new(replace(load, instances=tuple(instances)), targets, mutation)
        roles.append(role)
        instances.append(PdInstance(-1 - k, role, 0, capacity))
    return tuple(roles)


def prefill_joining(load: PdLoad, targets: PdTargets, joining: int, mutation: bool) -> bool:
    """Whether one of `joining` instances still loading takes the prefill role
    (`joining_roles`): with none serving, new requests wait for it (`pd.routable`)."""
    return PREFILL in joining_roles(load, targets, joining, mutation)


def decode_joining(load: PdLoad, targets: PdTargets, joining: int, mutation: bool) -> bool:
    """Whether one of `joining` instances still loading (they join in order, holding
    nothing) takes the decode role, as `role_for_new` will give it on the deployment as
    `load` shows it (`mutation`: the system mutates prefill instances)."""
    return DECODE in joining_roles(load, targets, joining, mutation)


def _load(i: PdInstance) -> tuple[float, int]:
    return (i.outstanding / i.capacity, i.index)


def handoff_target(
    source: int, instances: Sequence[PdInstance], decode_coming: bool = False
) -> int | None:
    """The decode instance that adopts a request parked on `source` (which counts it in its
    `outstanding`), or None while it waits: every decode instance is full, or none serves
    and `decode_coming` (one is loading, `decode_joining`). `source` itself when no decode
    instance serves or comes."""
    decode = [i for i in instances if i.role == DECODE]
    if not decode:
        return None if decode_coming else source
    room = [i for i in decode if i.outstanding - (i.index == source) < i.capacity]
    return min(room, key=_load).index if room else None
