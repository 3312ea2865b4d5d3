"""BlitzScale live scaling in the simulator (§4, §5.2): layer-level cooperative execution
on the zigzag schedule, not a speed factor."""

from dataclasses import replace

import pytest

from surge.policy.blitzscale.live_scaling import choose_schedule
from surge.policy.slo import BLITZSCALE_SLOS
from surge.policy.systems import system_config
from surge.sim.costs import cost_model
from surge.sim.hardware import load_cluster
from surge.sim.models import load_model
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.request import make_trace

MODEL = "llama2-7b"
SLO = BLITZSCALE_SLOS[MODEL]
"""BlitzScale §3's (its load monitor's bounds are profiled against it, §5.3)."""
INPUT_TOKENS = 2000


@pytest.fixture(scope="module")
def burst():
    """Two warm instances (P/D: a prefill and a decode one), then 48 equal prompts at
    once: the pool scales out by multicast from the idle decode instance (the busy prefill
    one's egress carries K/V, §5.1) and its new instances go live while they load."""
    n = 48
    trace = make_trace("burst", [0.0] * n, [INPUT_TOKENS] * n, [8] * n)
    settings = SimSettings("blitzscale-b", (MODEL,), "blitzscale", warm_instances=2, slo=SLO)
    sim = Simulation(trace, settings)
    return sim, sim.run()


def test_live_batches_follow_the_zigzag_schedule(burst):
    _, res = burst
    records = res.live_batches
    assert records, "no cooperative batch ran: live scaling is not layer-level"
    num_layers = load_model(MODEL).num_layers
    for rec in records:
        schedule = choose_schedule(rec.problem)
        # the batch took the schedule's split for its position, clipped as the runtime
        # clips it (to the layers held at that moment, and to L - 1)
        assert rec.planned_split == schedule.splits[rec.index]
        t = min(rec.planned_split[0], rec.held_layers, num_layers - 1)
        assert rec.split == (t, num_layers - t)
        assert rec.policy == schedule.policy
        assert 1 <= t < num_layers
    # the load ratio is measured on each scale-out, not a constant
    assert len({round(r.problem.load_ratio, 6) for r in records}) > 1


def test_a_live_batch_runs_its_layers_on_target_then_source(burst):
    """C2 of Eq. 1 carried out: the first token comes no earlier than the target's T
    layers followed by the source's S layers (the cost model's times); a speed factor
    or an instance serving the whole model would be faster than this bound for T > 0."""
    sim, res = burst
    slot = sim.world.models[0]
    cost = cost_model(slot.profile, slot.group.gpu, slot.tp)
    by_id = {r.id: r for r in sim.requests}
    for rec in res.live_batches:
        reqs = [by_id[i] for i in rec.request_ids]
        tokens = sum(r.input_tokens for r in reqs)
        target_s = cost.prefill_s(tokens, rec.split[0])
        source_s = cost.prefill_parts_s([(r.input_tokens, rec.split[1]) for r in reqs])
        for r in reqs:
            assert r.first_token_s >= rec.start_s + target_s + source_s - 1e-9
            assert r.done_s > r.first_token_s
    # every request of the burst finishes, each live one exactly once
    ids = [i for rec in res.live_batches for i in rec.request_ids]
    assert len(ids) == len(set(ids))
    assert all(r.done_s > 0 for r in sim.requests)


def test_live_scaling_shortens_the_burst_against_load_then_serve():
    n = 48
    trace = make_trace("burst", [0.0] * n, [INPUT_TOKENS] * n, [8] * n)
    settings = SimSettings("blitzscale-b", (MODEL,), "blitzscale", warm_instances=2, slo=SLO)
    live = Simulation(trace, settings).run()
    off = replace(system_config("blitzscale"), serve_while_loading="none")
    stop = Simulation(trace, settings, off).run()
    assert not stop.live_batches
    assert live.first_token_s.mean() < stop.first_token_s.mean()


def test_the_cost_model_of_a_partial_prefill():
    slot = load_model(MODEL)
    cost = cost_model(slot, load_cluster("blitzscale-b").groups[0].gpu)
    full = cost.prefill_s(3000)
    assert cost.prefill_parts_s([(1000, 32), (2000, 32)]) == pytest.approx(full)
    half = cost.prefill_parts_s([(1000, 16), (2000, 16)])
    assert half == pytest.approx(cost.prefill_s(3000, 16))
    assert half < full


def _bursts():
    """Two bursts 400 s apart (past a 5-minute keep-alive), each a scale-out from zero."""
    times = [t + 0.05 * i for t in (0.0, 400.0) for i in range(24)]
    return make_trace("two-bursts", times, [INPUT_TOKENS] * 48, [8] * 48)


@pytest.mark.parametrize("fraction,expect_hits", [(0.5, True), (0.005, False)])
def test_serverlessllm_misses_its_host_cache_when_it_is_too_small(fraction, expect_hits):
    """A 7B model (13.5 GB) in a 1000-GB host: half of it caches the model after the first
    SSD load; 0.5% (5 GB) cannot hold it, so every load is an SSD miss."""
    sllm = replace(system_config("serverlessllm"), host_cache_fraction=fraction)
    settings = SimSettings("blitzscale-b", (MODEL,), "serverlessllm")
    res = Simulation(_bursts(), settings, sllm).run()
    loads = res.cache_hits + res.cache_misses
    assert loads > 2 and res.cache_misses >= 1
    if expect_hits:
        assert res.cache_hits >= 1
    else:
        assert res.cache_hits == 0 and res.cache_misses == loads
    allcache = Simulation(_bursts(), settings, system_config("allcache")).run()
    assert allcache.cache_misses == 0
    assert allcache.first_token_s.mean() <= res.first_token_s.mean()


def test_the_load_monitor_sees_tokens_per_s_and_kv_use():
    """BlitzScale §5.3's monitor in the simulator: `pool_load` carries each instance's
    decode rate and KV use, which `policy.autoscale` counts against the system's bounds."""
    from surge.sim.scaling import pool_load

    n = 16
    trace = make_trace("decode", [0.0] * n, [INPUT_TOKENS] * n, [400] * n)
    settings = SimSettings("blitzscale-b", (MODEL,), "blitzscale", warm_instances=1, slo=SLO)
    sim = Simulation(trace, settings)
    seen: list = []
    pool = sim.pools[(0, "both")]

    def look() -> None:
        kv = {i.id: i.kv_tokens / i.kv_capacity_tokens for i in pool.instances}
        seen.append((pool_load(pool, 2.0, monitor=True), kv))

    sim.world.loop.schedule(2.0, 9, 0, look)
    sim.run()
    ((load, kv),) = seen
    busy = [i for i in load.instances if i.outstanding]
    assert busy and all(0 < i.kv_usage <= 1 for i in busy)
    assert any(i.tokens_per_s > 0 for i in busy)  # the decoding ones (a prefill one has none)
    assert all(i.kv_usage == pytest.approx(kv[i.instance_id]) for i in busy)


def test_batches_overlap_and_a_landing_layer_wakes_the_pending_batch(burst):
    """Fig. 12b: a target's next batch starts before an earlier one's first token (the
    target on one batch while the source runs another), at most `max_in_flight` under way;
    §5.2 (2): a zigzag batch that waited for layers ran when the block bringing them
    landed (`LiveScaling.landed`), not at the next poll."""
    sim, res = burst
    first = {r.id: r.first_token_s for r in sim.requests}
    recs = res.live_batches
    done = {id(a): min(first[i] for i in a.request_ids) for a in recs}
    overlapping = [
        (a, b)
        for a in recs
        for b in recs
        if a is not b and a.target == b.target and a.start_s < b.start_s < done[id(a)]
    ]
    assert overlapping
    for a in recs:  # never more than max_in_flight (2) batches of one target under way
        under_way = [
            b for b in recs if b.target == a.target and b.start_s <= a.start_s < done[id(b)]
        ]
        assert len(under_way) <= 2
    assert res.live_woken >= 1
