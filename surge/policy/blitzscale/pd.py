"""Prefill/decode disaggregation (BlitzScale §5.2, §6): every P/D decision.

In: the serving instances of one P/D deployment as `PdInstance`s (role, requests held,
tokens/s, KV-cache use and K/V ingress measured by the body), the requests waiting at the
router, the
deployment's `PdTargets` and the system's `PdSettings`. Out:
- `role_for_new`: the role a new instance takes (prefill until the prefill target is met,
  then decode; past both, prefill when the system mutates — decode then grows by
  mutation, new prefill instances compensate, §5.2 — else the busier role by
  `role_loads`, §6.1's baselines scaling each role on its own load, and the targets'
  ratio when both are equally busy);
- `routable`: which instances take new requests (prefill ones; none while no prefill
  instance serves but one is coming, `handoff.prefill_joining`; every one when none serves or
  comes, so a deployment is never left without a way in);
- where a prefilled request decodes (`decodes_where_prefilled`, `handoff_target`,
  `decode_joining`) is `policy.blitzscale.handoff`'s;
- §5.2's mutation (`decide_mutation`, `scale_out_mutations`) and the monitor's `look`
  (a mutation, then `monitor`) are `policy.blitzscale.pd_mutation`'s;
- `serving_floor`: a P/D deployment's autoscaler settings: while it holds requests it
  keeps at least two instances, a prefill and a decode one (§2.1, §4);
- `ingress_usage`: the K/V ingress both bodies measure (hand-offs' link time per second
  over the monitor's window);
- `monitor` (BlitzScale's load monitor, §5, its per-role half): whether the pool wants
  another instance now because one role is saturated (KV use at the threshold on every
  decode instance, or prefill full while requests wait) or a role has no instance while
  the other holds requests or requests wait (§4). The pool-level half — instances
  enough for the pool's tokens/s and KV use, and the 2 s scale-down — is
  `policy.autoscale.decide` with the system's `target_tokens_per_s` / `target_kv_usage`;
- `with_monitor` adds what the monitor wants to the autoscaler's own scale-out.
Pure and deterministic. Both bodies carry these out: `surge serve` (`control/pd.py`,
`runtime/migration/pd_handoff.py`) and the simulator (`sim/pd.py`, `sim/pools.py`,
`sim/scaling.py`);
`tests/parity/test_pd_parity.py` proves they take the same actions.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace

from surge.errors import SurgeError
from surge.policy.autoscale import RATE_WINDOW_S
from surge.policy.autoscale_settings import AutoscaleSettings

PREFILL = "prefill"
DECODE = "decode"
ROLES = (PREFILL, DECODE)


@dataclass(frozen=True)
class PdTargets:
    """How many prefill and decode instances a deployment aims for (its spec's `pd:`, or
    the system's default 1:1)."""

    prefill: int = 1
    decode: int = 1

    def __post_init__(self) -> None:
        if self.prefill < 1 or self.decode < 1:
            raise SurgeError(f"pd needs prefill >= 1 and decode >= 1 (got {self})")


@dataclass(frozen=True)
class PdSettings:
    """The P/D monitor's thresholds (a system's field). Validated at construction."""

    decode_busy_fraction: float = 0.75
    """Requests held per decode instance over its capacity (mean over the decode
    instances), or K/V handed to one decode instance over what its link carries, at which
    decode is the bottleneck."""
    kv_busy_fraction: float = 0.8
    """KV-cache use (0..1) of a decode instance at which decode is the bottleneck."""
    prefill_idle_requests: int = 0
    """A prefill instance holding at most this many requests is idle."""
    min_prefill: int = 1
    """Prefill instances that never mutate."""
    mutation_cooldown_s: float = 1.0
    """Least time between two mutations of one deployment (the monitor sees the last one's
    effect first)."""
    mutate_on_scale_out: bool = True
    """Mutation is how decode scales (§5.2, §6.3): a scale-out whose new instance would
    decode by load mutates a prefill instance at once (`scale_out_mutations`), and each
    mutation the monitor makes asks for a prefill instance to compensate. False: the
    monitor's mutation alone, when decode is the bottleneck and a prefill instance idles
    (surge before 2026-11-28; Fig. 17's counterfactual)."""

    def __post_init__(self) -> None:
        if not 0 < self.decode_busy_fraction <= 1 or not 0 < self.kv_busy_fraction <= 1:
            raise SurgeError("pd: decode_busy_fraction and kv_busy_fraction in (0, 1]")
        if self.prefill_idle_requests < 0 or self.min_prefill < 1:
            raise SurgeError("pd: prefill_idle_requests >= 0 and min_prefill >= 1")
        if self.mutation_cooldown_s < 0:
            raise SurgeError("pd: mutation_cooldown_s >= 0")


@dataclass(frozen=True)
class PdInstance:
    """One serving instance of a P/D deployment as the monitor sees it."""

    index: int
    """Stable id, its age: ties go to the lowest (the oldest)."""
    role: str
    outstanding: int
    """Requests it holds (prefilling, parked for hand-off or decoding)."""
    capacity: int
    """Most requests it holds at once (> 0)."""
    tokens_per_s: float = 0.0
    """Tokens it generated per second over the monitor's window."""
    kv_usage: float = 0.0
    """Fraction of its KV cache in use, 0..1."""
    parked: int = 0
    """Of `outstanding`, requests prefilled and parked, waiting for a decode instance."""
    kv_ingress_usage: float = 0.0
    """K/V handed to it over the monitor's window as a fraction of what its ingress link
    carries in that time (each hand-off's bytes over the link's bytes/s, summed, over the
    window; > 1 when more arrives than the link carries): the tokens per second of §5.3's
    monitor that a decode instance takes in, whose upper bound is its link (§5.2: K/V
    transfer is incast on decode)."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise SurgeError(f"role must be one of {ROLES} (got {self.role!r})")
        if self.capacity < 1 or self.outstanding < 0:
            raise SurgeError("PdInstance: capacity >= 1, outstanding >= 0")


@dataclass(frozen=True)
class PdLoad:
    """A P/D deployment at one instant."""

    instances: tuple[PdInstance, ...]
    num_waiting: int = 0
    """Requests waiting at the router (no instance has taken them)."""
    num_handoffs_waiting: int = 0
    """Prefilled requests waiting for room on a decode instance."""
    since_last_mutation_s: float = float("inf")


@dataclass(frozen=True)
class MonitorDecision:
    """What the load monitor asks of the autoscaler now."""

    scale_out: int
    """Instances wanted on top of what the concurrency target asks (0 or 1)."""
    reason: str = ""


def role_for_new(load: PdLoad, targets: PdTargets, mutation: bool = False) -> str:
    """The role of a new instance of a deployment as `load` shows it (instances joining at
    the same time included, holding nothing); `mutation`: the system mutates prefill
    instances into decode ones."""
    roles = [i.role for i in load.instances]
    num_prefill, num_decode = roles.count(PREFILL), roles.count(DECODE)
    if num_prefill < targets.prefill:
        return PREFILL
    if num_decode < targets.decode:
        return DECODE
    if mutation:
        # BlitzScale §5.2: a decode instance is scaled by switching a prefill instance to
        # decode while new prefill instances compensate (§6.1: on AzureCode "we can
        # directly mutate a prefill instance to a decode instance while lively scaling
        # another prefill instance"), so past the targets new instances prefill.
        return PREFILL
    # §6.1: the baselines' "prefill and decode instances scales independently based on
    # their loads": the busier role grows. Equally busy (an idle fleet starting, as
    # DistServe's fixed one does): keep the targets' ratio, prefill on ties.
    prefill_load, decode_load = role_loads(load)
    if prefill_load != decode_load:
        return PREFILL if prefill_load > decode_load else DECODE
    if num_prefill * targets.decode <= num_decode * targets.prefill:
        return PREFILL
    return DECODE


def serving_floor(settings: AutoscaleSettings) -> AutoscaleSettings:
    """A P/D deployment's autoscaler `settings`: while any request is outstanding it holds
    at least as many instances as roles (`min_serving`), so the pool that scales out from
    zero starts a prefill and a decode instance together, and a request's decode runs on a
    decode instance, not on the instance that prefilled it (the floor counts instances:
    `monitor` asks for a decode instance when the ones left all prefill). BlitzScale §2.1:
    P/D "uses two replicas of the same model to serve the prefill and decode phases of a
    request, respectively"; §4: "it uses at least two serving instances, a prefill and a decode";
    §6.1: "For all the workload, we run with prefill and decode disaggregation". The roles
    are kept by `pd_release.releasable` (a release never leaves the instances that stay
    without one of them) and by `monitor` (it asks for the missing one). Within
    `max_replicas`: a deployment held to one instance decodes in place
    (`policy.blitzscale.handoff.handoff_target`'s fallback when no decode instance serves
    or loads)."""
    return replace(settings, min_serving=max(settings.min_serving, len(ROLES)))


def role_loads(load: PdLoad) -> tuple[float, float]:
    """(prefill, decode) load of a deployment, each a fraction of its role's capacity:
    prefill, the requests its instances prefill (parked ones excluded) and those waiting
    at the router; decode, the requests its instances hold and those waiting for decode
    room, or its instances' mean KV-cache use or mean K/V ingress when higher (a decode
    instance takes in every request's K/V through one link: §5.2's incast). A role
    without instances: 0."""
    prefill = [i for i in load.instances if i.role == PREFILL]
    decode = [i for i in load.instances if i.role == DECODE]
    prefill_load = 0.0
    if prefill:
        held = sum(i.outstanding - i.parked for i in prefill) + load.num_waiting
        prefill_load = held / sum(i.capacity for i in prefill)
    decode_load = 0.0
    if decode:
        held = sum(i.outstanding for i in decode) + load.num_handoffs_waiting
        kv = sum(i.kv_usage for i in decode) / len(decode)
        ingress = sum(i.kv_ingress_usage for i in decode) / len(decode)
        decode_load = max(held / sum(i.capacity for i in decode), kv, ingress)
    return prefill_load, decode_load


def ingress_usage(handed: Sequence[tuple[float, float]], now_s: float) -> float:
    """An instance's `kv_ingress_usage` now: of its hand-offs as (when, seconds of its
    ingress link the K/V takes alone), those within the monitor's window, per second of
    the window."""
    return sum(s for t, s in handed if t >= now_s - RATE_WINDOW_S) / RATE_WINDOW_S


def routable(instances: Sequence[PdInstance], prefill_coming: bool = False) -> tuple[int, ...]:
    """Indices of the instances that take new requests: the prefill ones. With none
    serving, none while one is on its way (`prefill_coming`: an instance still loading
    joins as prefill, `handoff.joining_roles`; a live one prefills cooperatively as it loads,
    `live_scaling`): requests wait at the router for it rather than being prefilled and
    decoded whole on a decode instance (§2.1: P/D "uses two replicas of the same model to
    serve the prefill and decode phases of a request, respectively"; §6.1: "For all the
    workload, we run with prefill and decode disaggregation"; a pool of decode instances
    alone arises once its prefill instances mutate or are released, §5.2). Every instance
    only when no prefill instance serves or comes (a deployment at `max_replicas`), so a
    deployment is never left without a way in."""
    prefill = tuple(i.index for i in instances if i.role == PREFILL)
    if prefill or prefill_coming:
        return prefill
    return tuple(i.index for i in instances)


def monitor(load: PdLoad, s: PdSettings) -> MonitorDecision:
    """BlitzScale's load monitor: another instance when every decode instance's KV cache
    is at the threshold (decode cannot take more), when prefill instances hold requests
    and no decode instance serves (the new one decodes, `role_for_new`; §4: P/D "uses at
    least two serving instances, a prefill and a decode" — else they decode in place),
    when requests wait and only decode instances serve (the new one prefills), or
    when requests wait and every prefill instance is full (prefill cannot take more); else
    none."""
    decode = [i for i in load.instances if i.role == DECODE]
    if decode and min(i.kv_usage for i in decode) >= s.kv_busy_fraction:
        return MonitorDecision(1, "every decode instance's KV cache is at the threshold")
    prefill = [i for i in load.instances if i.role == PREFILL]
    if not decode and any(i.outstanding for i in prefill):
        return MonitorDecision(1, "no decode instance while prefill instances hold requests")
    if not prefill and decode and load.num_waiting > 0:
        # the symmetric case (`routable` holds requests for a prefill instance): the new
        # one prefills (`role_for_new`: below the prefill target)
        return MonitorDecision(1, "no prefill instance while requests wait")
    if load.num_waiting > 0 and prefill and all(i.outstanding >= i.capacity for i in prefill):
        return MonitorDecision(1, "requests wait and every prefill instance is full")
    return MonitorDecision(0)


def with_monitor(scale_out: int, wants: int, all_serving: bool, room: bool) -> int:
    """Instances to add: the autoscaler's `scale_out`, or, when it adds none, what the
    monitor `wants` — only when every instance serves (one still loading answers the
    monitor already) and the deployment has room below its `max_replicas`."""
    if scale_out == 0 and wants and all_serving and room:
        return wants
    return scale_out
