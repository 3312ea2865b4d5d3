"""`surge.policy.blitzscale.pd`: roles of new instances, routing, mutation, monitor (the
hand-off target: `test_pd_handoff.py`)."""

from dataclasses import replace

import pytest

from surge.errors import SurgeError
from surge.policy.autoscale import PoolLoad, decide
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.blitzscale.pd import (
    DECODE,
    PREFILL,
    PdInstance,
    PdLoad,
    PdSettings,
    PdTargets,
    monitor,
    role_for_new,
    role_loads,
    routable,
    serving_floor,
)
from surge.policy.blitzscale.pd_mutation import decide_mutation, look, scale_out_mutations

S = PdSettings(decode_busy_fraction=0.5, kv_busy_fraction=0.8)


def _i(index, role, outstanding=0, capacity=8, kv=0.0) -> PdInstance:
    return PdInstance(index, role, outstanding, capacity, kv_usage=kv)


def _fleet(num_prefill: int, num_decode: int, held: int = 0) -> PdLoad:
    """A deployment of idle prefill instances and decode ones holding `held` each."""
    roles = [PREFILL] * num_prefill + [DECODE] * num_decode
    return PdLoad(tuple(_i(k, r, held if r == DECODE else 0) for k, r in enumerate(roles)))


def test_new_instances_fill_the_targets_then_keep_their_ratio_when_idle() -> None:
    t = PdTargets(prefill=2, decode=1)
    roles, p, d = [], 0, 0
    for _ in range(6):
        r = role_for_new(_fleet(p, d), t)
        roles.append(r)
        p, d = p + (r == PREFILL), d + (r == DECODE)
    assert roles == [PREFILL, PREFILL, DECODE, PREFILL, DECODE, PREFILL]
    # After a mutation (one prefill fewer) the next instance is a prefill one.
    assert role_for_new(_fleet(1, 2), t) == PREFILL
    # A system that mutates grows decode by mutation (§5.2): past the targets, prefill.
    assert role_for_new(_fleet(4, 1), t) == DECODE
    assert role_for_new(_fleet(4, 1), t, mutation=True) == PREFILL
    assert role_for_new(_fleet(2, 0), t, mutation=True) == DECODE  # the targets first
    with pytest.raises(SurgeError):
        PdTargets(0, 1)


def test_past_the_targets_a_system_that_does_not_mutate_grows_the_busier_role() -> None:
    """§6.1: the baselines' prefill and decode "scale independently based on their loads"
    (the ratio alone would give these 1:1 fleets a prefill instance every time)."""
    t = PdTargets(prefill=1, decode=1)
    assert role_for_new(_fleet(1, 1, held=6), t) == DECODE  # decode 6/8 full, prefill idle
    assert role_for_new(_fleet(1, 1, held=6), t, mutation=True) == PREFILL
    queued = replace(_fleet(1, 1, held=6), num_waiting=8)  # prefill (0 + 8)/8 > 6/8
    assert role_for_new(queued, t) == PREFILL
    # Prefilled requests waiting for decode room count on decode's side, not prefill's.
    parked = PdLoad(
        (PdInstance(0, PREFILL, 4, 8, parked=4), _i(1, DECODE, 2)), num_handoffs_waiting=4
    )
    assert role_loads(parked) == (0.0, 0.75)
    assert role_for_new(parked, t) == DECODE
    # KV use counts for decode (the mean over decode instances).
    kv = PdLoad((_i(0, PREFILL, 2), _i(1, DECODE, 1, kv=0.9), _i(2, DECODE, 1, kv=0.5)))
    assert role_loads(kv) == (0.25, 0.7)
    assert role_for_new(kv, PdTargets(1, 2)) == DECODE
    # Equally busy: the targets' ratio again (1:1 here, a tie: prefill).
    assert role_for_new(PdLoad((_i(0, PREFILL, 4), _i(1, DECODE, 4))), t) == PREFILL


def test_new_requests_go_to_prefill_instances() -> None:
    xs = [_i(0, PREFILL, 3), _i(1, DECODE, 5), _i(2, DECODE, 2), _i(3, DECODE, 2)]
    assert routable(xs) == (0,)
    assert routable([_i(1, DECODE), _i(2, DECODE)]) == (1, 2)  # never without a way in


def test_with_decode_instances_alone_requests_wait_for_a_prefill_instance_coming() -> None:
    """§2.1 / §6.1: a request's prefill and decode run on two replicas, so a pool of decode
    instances alone (its prefill instances mutated or released) does not prefill and
    decode whole requests while a prefill instance is on its way: they wait at the router.
    Before, every decode instance took them."""
    alone = [_i(1, DECODE), _i(2, DECODE)]
    assert routable(alone, prefill_coming=True) == ()
    assert routable([_i(0, PREFILL), *alone], prefill_coming=True) == (0,)
    wants = monitor(PdLoad(tuple(alone), num_waiting=2), S)  # none coming: ask for one
    assert wants.scale_out == 1 and "no prefill instance" in wants.reason
    assert role_for_new(PdLoad(tuple(alone)), PdTargets()) == PREFILL  # it prefills
    assert monitor(PdLoad(tuple(alone)), S).scale_out == 0  # nothing waits


def test_mutation_needs_a_decode_bottleneck_and_a_spare_prefill_instance() -> None:
    busy = [_i(0, PREFILL, 1), _i(1, PREFILL, 0), _i(2, DECODE, 6)]
    m = decide_mutation(PdLoad(tuple(busy)), S)
    assert m is not None and m.index == 1 and "idle" in m.reason
    # Hand-offs waiting for decode room; the prefill instance holding only parked requests
    # is idle.
    parked = (_i(0, PREFILL, 1), _i(1, PREFILL, 2), _i(2, DECODE, 1, capacity=1))
    parked = (*parked[:1], PdInstance(1, PREFILL, 2, 8, parked=2), parked[2])
    m = decide_mutation(PdLoad(parked, num_handoffs_waiting=2), S)
    assert m is not None and m.index == 1 and "wait for decode room" in m.reason
    # Decode keeps up: no mutation.
    calm = [_i(0, PREFILL, 1), _i(1, PREFILL, 0), _i(2, DECODE, 2)]
    assert decide_mutation(PdLoad(tuple(calm)), S) is None
    # KV use at the threshold is a bottleneck too.
    kv = [_i(0, PREFILL, 1), _i(1, PREFILL, 0), _i(2, DECODE, 1, kv=0.9)]
    assert decide_mutation(PdLoad(tuple(kv)), S) is not None
    # The last prefill instance never mutates.
    assert decide_mutation(PdLoad((_i(0, PREFILL), _i(2, DECODE, 9))), S) is None
    # Busy prefill with requests waiting: not overprovisioned.
    both_busy = (_i(0, PREFILL, 3), _i(1, PREFILL, 2), _i(2, DECODE, 9))
    assert decide_mutation(PdLoad(both_busy, num_waiting=4), S) is None
    # ... and with nothing waiting it is: the least loaded (youngest among equals) goes.
    m = decide_mutation(PdLoad(both_busy, num_waiting=0), S)
    assert m is not None and m.index == 1
    # Cool-down after a mutation.
    assert decide_mutation(PdLoad(tuple(busy), since_last_mutation_s=0.1), S) is None


def test_monitor_asks_for_capacity_on_kv_pressure_or_saturated_prefill() -> None:
    full_kv = (_i(0, PREFILL), _i(1, DECODE, kv=0.85), _i(2, DECODE, kv=0.9))
    assert monitor(PdLoad(full_kv), S).scale_out == 1
    one_ok = (_i(0, PREFILL), _i(1, DECODE, kv=0.85), _i(2, DECODE, kv=0.1))
    assert monitor(PdLoad(one_ok), S).scale_out == 0
    sat = (_i(0, PREFILL, 8), _i(1, DECODE))
    assert monitor(PdLoad(sat, num_waiting=3), S).scale_out == 1
    assert monitor(PdLoad(sat, num_waiting=0), S).scale_out == 0


def test_the_monitor_asks_for_a_decode_instance_when_prefill_ones_hold_requests() -> None:
    """§4: P/D "uses at least two serving instances, a prefill and a decode". A deployment
    that released its idle decode instance while prefill ones served (the floor counts
    instances, not roles) asks for one, which joins as decode; before, its prefill
    instances decoded in place."""
    only_prefill = (_i(0, PREFILL, 2), _i(1, PREFILL))
    wants = monitor(PdLoad(only_prefill), S)
    assert wants.scale_out == 1 and "no decode instance" in wants.reason
    assert role_for_new(PdLoad(only_prefill), PdTargets()) == DECODE
    assert monitor(PdLoad((_i(0, PREFILL), _i(1, PREFILL))), S).scale_out == 0  # idle


def test_requests_parked_for_decode_are_decode_load_and_the_router_queue_prefill_load() -> None:
    """What the busier-role rule counts when decode is the bottleneck: prefill instances
    full of requests parked for decode room, the decode instance full, the rest of a burst
    at the router. The parked ones are decode's load only (`parked` off prefill's,
    `num_handoffs_waiting` on decode's). The router queue is prefill's: it needs a prefill
    next, and §5.3's load ("tokens per second and KVCache usage") counts no queue for either
    role, so nothing in the paper moves it to decode. With batch 2 a 48-request burst gets
    prefill instances until the fourth (benchmarks/systems/blitzscale.py ends 3 prefill +
    1 decode); counting the queue against the role holding the prefill slots (decode,
    here) would make the first new one decode: a counterfactual (NOTES.md 2026-11-29 pdrole)."""
    for num_prefill in (1, 2, 3):
        prefill = tuple(PdInstance(k, PREFILL, 2, 2, parked=2) for k in range(num_prefill))
        load = PdLoad(
            (*prefill, _i(9, DECODE, 2, capacity=2)),
            num_waiting=48 - 2 * (num_prefill + 1),
            num_handoffs_waiting=2 * num_prefill,
        )
        p, d = role_loads(load)
        assert d == 1 + num_prefill  # (2 decoding + 2 parked per prefill instance) / 2
        assert p == load.num_waiting / (2 * num_prefill)  # the queue alone, parked ones not
        assert role_for_new(load, PdTargets()) == PREFILL


def test_decode_ingress_is_decode_load() -> None:
    """BlitzScale §5.2: a decode instance takes in every request's K/V through one link
    (its incast). Decode instances holding few requests, with little KV in use, whose links
    the K/V handed to them fills, are a decode bottleneck: a prefill instance mutates, and a
    system that does not mutate gives a new instance the decode role."""
    calm = (_i(0, PREFILL, 1), _i(1, PREFILL, 0), _i(2, DECODE, 1), _i(3, DECODE, 1))
    assert decide_mutation(PdLoad(calm), S) is None
    # one decode instance's link carried 0.6 s of K/V per second over the window
    fed = (*calm[:3], replace(calm[3], kv_ingress_usage=0.6))
    m = decide_mutation(PdLoad(fed), S)
    assert m is not None and m.index == 1 and "ingress" in m.reason
    # below the threshold it is not
    light = (*calm[:3], replace(calm[3], kv_ingress_usage=0.4))
    assert decide_mutation(PdLoad(light), S) is None
    # the baselines' roles (§6.1: each role scales on its load): decode busier by ingress
    busy_prefill = (_i(0, PREFILL, 3), _i(1, DECODE, 1))
    assert role_for_new(PdLoad(busy_prefill), PdTargets()) == PREFILL
    fed_decode = (busy_prefill[0], replace(busy_prefill[1], kv_ingress_usage=0.9))
    assert role_loads(PdLoad(fed_decode))[1] == pytest.approx(0.9)
    assert role_for_new(PdLoad(fed_decode), PdTargets()) == DECODE


def test_a_scale_out_for_decode_load_mutates_a_prefill_instance_at_once() -> None:
    """BlitzScale §5.2/§6.3: decode is scaled by switching a prefill instance to decode at
    the scale-out decision, while the new instance prefills (the remedy) -- not only once a
    prefill instance idles while decode is the bottleneck."""
    t = PdTargets(prefill=1, decode=1)
    # decode 5/8 (below the monitor's threshold), two prefill instances, one idle
    fleet = PdLoad((_i(0, PREFILL, 2), _i(1, DECODE, 5), _i(2, PREFILL, 0)))
    assert decide_mutation(fleet, PdSettings()) is None  # the monitor alone does nothing
    assert role_for_new(fleet, t) == DECODE  # by load a new instance would decode
    (m,) = scale_out_mutations(fleet, t, 1, PdSettings())
    assert m.index == 2  # the idle one
    # two new instances: the second sees the first mutation (decode 5/16): it prefills
    assert len(scale_out_mutations(fleet, t, 2, PdSettings())) == 1
    # prefill busier than decode: the new instance prefills, nothing mutates
    queued = replace(fleet, num_waiting=20)
    assert scale_out_mutations(queued, t, 1, PdSettings()) == ()
    # `min_prefill` stays prefill
    alone = PdLoad((_i(0, PREFILL, 0), _i(1, DECODE, 7)))
    assert scale_out_mutations(alone, t, 1, PdSettings()) == ()
    # off (the counterfactual of mutation by the monitor alone): none, and no remedy
    off = PdSettings(mutate_on_scale_out=False)
    assert scale_out_mutations(fleet, t, 1, off) == ()


def test_the_monitor_asks_for_a_prefill_instance_after_each_mutation() -> None:
    """§5.2: "we scale multiple prefill instances to compensate"."""
    busy = PdLoad((_i(0, PREFILL), _i(1, DECODE, 7), _i(2, PREFILL)))
    seen = look(busy, S, mutation=True)
    assert seen.mutation is not None and seen.monitor.scale_out == 1
    assert look(busy, S, mutation=False).monitor.scale_out == 0
    alone = look(busy, replace(S, mutate_on_scale_out=False), mutation=True)
    assert alone.mutation is not None and alone.monitor.scale_out == 0


def test_a_pd_deployment_serves_on_a_prefill_and_a_decode_instance() -> None:
    """BlitzScale §2.1 / §4: P/D "uses at least two serving instances, a prefill and a
    decode". At zero, the first request starts two instances (one before); a pool whose
    requests one instance carries keeps two while it serves, and goes to zero once idle;
    a deployment held to one instance keeps one."""
    s = AutoscaleSettings(target_ongoing_requests=4, keep_alive_s=None)
    pd_s = serving_floor(s)
    assert pd_s.min_serving == 2 and serving_floor(pd_s) == pd_s
    assert decide(PoolLoad(0.0, 1, ()), s).scale_out == 1
    assert decide(PoolLoad(0.0, 1, ()), pd_s).scale_out == 2
    assert decide(PoolLoad(0.0, 0, ()), pd_s).desired == 0
    one = serving_floor(replace(s, max_replicas=1))
    assert decide(PoolLoad(0.0, 1, ()), one).scale_out == 1
    with pytest.raises(SurgeError):
        AutoscaleSettings(min_serving=0)
