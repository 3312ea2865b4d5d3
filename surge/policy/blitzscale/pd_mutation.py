"""BlitzScale §5.2 "mutation": a prefill instance of a P/D deployment turns into a decode one,
keeping its weights, when decode is the bottleneck; and the monitor's look that decides it.

In: the deployment as `policy.blitzscale.pd` sees it (`PdLoad`, `PdTargets`, `PdSettings`).
Out:
- `decide_mutation`: when decode is the bottleneck (hand-offs waiting for decode room,
  requests per decode instance, K/V ingress or KV-cache use at the threshold) and a
  prefill instance is idle (nothing but parked requests) or overprovisioned, that prefill
  instance becomes a decode one; `min_prefill` prefill instances always stay;
- `scale_out_mutations` (§5.2, §6.3): at a scale-out decision, the prefill instances that
  turn into decode ones now, one for each new instance that roles by load would make a
  decode one; the new instances prefill (the remedy);
- `look`: one look of the monitor (mutation when the system mutates, then
  `pd.monitor` on the deployment as it is after that mutation) -> `PdLook`.
Pure and deterministic. Both bodies carry these out: `surge serve` (`control/pd.py`) and
the simulator (`sim/pd.py`, `sim/scaling.py`); `tests/parity/test_pd_parity.py` proves
they take the same actions.
"""

from dataclasses import dataclass, replace

from surge.policy.blitzscale.pd import (
    DECODE,
    PREFILL,
    MonitorDecision,
    PdInstance,
    PdLoad,
    PdSettings,
    PdTargets,
    monitor,
    role_for_new,
)


@dataclass(frozen=True)
class Mutation:
    """Turn prefill instance `index` into a decode instance (weights stay, §5.2)."""

    index: int
    reason: str
    """What made decode the bottleneck (for logs and tests)."""


def _idle(i: PdInstance, s: PdSettings) -> bool:
    return i.outstanding - i.parked <= s.prefill_idle_requests


def _load_young(i: PdInstance) -> tuple[float, int]:
    return (i.outstanding / i.capacity, -i.index)


def _decode_bottleneck(load: PdLoad, s: PdSettings) -> str | None:
    # §5.3's monitor: tokens/s and KV use against a per-instance bound. A decode instance
    # takes in each request's K/V (§5.2: "the incast nature of ... KVCache transfer"), so
    # the K/V handed to it counts against its link as its requests count against its
    # capacity (the same threshold); like KV use, one instance over it is a bottleneck.
    decode = [i for i in load.instances if i.role == DECODE]
    if not decode:
        return "no decode instance"
    if load.num_handoffs_waiting > 0:
        return f"{load.num_handoffs_waiting} prefilled requests wait for decode room"
    per = sum(i.outstanding / i.capacity for i in decode) / len(decode)
    if per >= s.decode_busy_fraction:
        return f"decode instances {per:.2f} full >= {s.decode_busy_fraction}"
    ingress = max(i.kv_ingress_usage for i in decode)
    if ingress >= s.decode_busy_fraction:
        return f"decode K/V ingress {ingress:.2f} of its links >= {s.decode_busy_fraction}"
    kv = max(i.kv_usage for i in decode)
    if kv >= s.kv_busy_fraction:
        return f"decode KV use {kv:.2f} >= {s.kv_busy_fraction}"
    return None


def decide_mutation(load: PdLoad, s: PdSettings) -> Mutation | None:
    """A prefill instance to turn into a decode one now, or None (§5.2)."""
    if load.since_last_mutation_s < s.mutation_cooldown_s:
        return None
    prefill = [i for i in load.instances if i.role == PREFILL]
    if len(prefill) <= s.min_prefill:
        return None
    reason = _decode_bottleneck(load, s)
    if reason is None:
        return None
    # Idle prefill instances first; else, with nothing waiting at the router, prefill is
    # overprovisioned and the least loaded one goes. The youngest among equals: the
    # oldest prefill instances stay prefill.
    idle = [i for i in prefill if _idle(i, s)]
    if idle:
        return Mutation(max(idle, key=lambda i: i.index).index, reason + "; prefill idle")
    if load.num_waiting == 0:
        least = min(prefill, key=_load_young)
        return Mutation(least.index, reason + "; prefill overprovisioned")
    return None


def scale_out_mutations(
    load: PdLoad, targets: PdTargets, count: int, s: PdSettings
) -> tuple[Mutation, ...]:
    """§5.2 at a scale-out decision of `count` instances: the prefill instances that turn
    into decode ones now, one for each new instance
    that roles by load (`role_for_new` without mutation, the baselines' §6.1 rule) would
    make a decode one past the targets. That instance prefills instead (a mutating system's
    new instances do, `role_for_new`): "when live scaling a decode instance, we first
    switch a prefill instance to a decode instance. At the same time, we scale multiple
    prefill instances to compensate". So decode grows when the load asks for it, at once
    and without moving weights, not only once a prefill instance idles. Serving prefill
    instances only, idle ones first, then the least loaded (the youngest among equals);
    `min_prefill` always stay. The load is the serving instances' (§6.3 mutates when "its
    prefill instances are relatively spare"; instances still loading serve nothing yet)
    plus the new instances decided here, joining and holding nothing."""
    if not s.mutate_on_scale_out:
        return ()
    instances = list(load.instances)
    capacity = max((i.capacity for i in instances), default=1)
    chosen: list[Mutation] = []
    joining = -1  # joining instances' indices: below every serving one's (>= 0)
    for _ in range(count):
        view = replace(load, instances=tuple(instances))
        role = role_for_new(view, targets, mutation=True)
        if role == PREFILL and role_for_new(view, targets) == DECODE:
            prefill = [i for i in instances if i.role == PREFILL and i.index >= 0]
            if len(prefill) > s.min_prefill:
                least = min(prefill, key=lambda i: (not _idle(i, s), *_load_young(i)))
                chosen.append(Mutation(least.index, "a scale-out for decode load"))
                instances = [replace(i, role=DECODE) if i is least else i for i in instances]
        instances.append(PdInstance(joining, role, 0, capacity))
        joining -= 1
    return tuple(chosen)


@dataclass(frozen=True)
class PdLook:
    """One look of the P/D monitor: what to carry out now."""

    mutation: Mutation | None
    """The prefill instance to turn into a decode one now, if any."""
    monitor: MonitorDecision
    """What the per-role monitor asks of the autoscaler, seen after the mutation."""


def look(load: PdLoad, s: PdSettings, mutation: bool) -> PdLook:
    """The monitor's look at a deployment: a mutation (only when the system mutates,
    §5.2), then `monitor` on the deployment as that mutation leaves it (the mutated
    instance decodes; the cooldown restarts); after a mutation the monitor asks for one
    instance more, the prefill one that compensates (§5.2, §6.3: "mutate a prefill instance
    to a decode instance while lively scaling another prefill instance for remedy")."""
    chosen = decide_mutation(load, s) if mutation else None
    after = load
    if chosen is not None:
        instances = tuple(
            replace(i, role=DECODE) if i.index == chosen.index else i for i in load.instances
        )
        after = replace(load, instances=instances, since_last_mutation_s=0.0)
    wants = monitor(after, s)
    if chosen is not None and s.mutate_on_scale_out:  # §5.2: "... to compensate"
        wants = MonitorDecision(1, "a prefill instance to compensate the mutation")
    return PdLook(chosen, wants)
