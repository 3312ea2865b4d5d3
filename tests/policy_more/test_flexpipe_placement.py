"""FlexPipe §6.2 slot allocation (Eq. 6-9) and §7 affinity placement (Eq. 13)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.errors import SurgeError
from surge.policy.flexpipe.slot_allocation import (
    AffinitySettings,
    HostingRecord,
    MultiplexSettings,
    SlotState,
    StageDemand,
    affinity_score,
    allocate_slots,
    choose_affinity_server,
    multiplexing_penalty,
)


def test_eq9_penalty_grows_with_cv_squared() -> None:
    s = MultiplexSettings(base_penalty=0.2, cv_sensitivity=0.5)
    assert multiplexing_penalty(0.0, s) == pytest.approx(0.2)
    assert multiplexing_penalty(2.0, s) == pytest.approx(0.2 * (1 + 0.5 * 4))


def test_stable_models_share_a_slot_and_bursty_ones_are_isolated() -> None:
    s = MultiplexSettings(base_penalty=0.05, cv_sensitivity=1.0, idle_slot_cost=0.3)
    slots = (SlotState(0, 100, (("resident", 0.1),)), SlotState(1, 100))
    stable = allocate_slots([StageDemand("m", 0, 10, 1.0, cv=0.2)], slots, s)
    assert stable.assignments == (("m", 0, 0),)  # 0.05(1.04) + 0.05(1.01) < 0.3
    bursty = allocate_slots([StageDemand("m", 0, 10, 1.0, cv=3.0)], slots, s)
    assert bursty.assignments == (("m", 0, 1),)  # 0.05 * 10 > 0.3: stays alone


def test_two_stages_of_one_model_never_share_a_slot_even_when_sharing_is_cheap() -> None:
    s = MultiplexSettings(base_penalty=0.0, idle_slot_cost=10.0)
    stages = [StageDemand("m", i, 10, 1.0, 0.0) for i in range(3)]
    out = allocate_slots(stages, (SlotState(0, 1000), SlotState(1, 1000)), s)
    assert len(out.assignments) == 2 and out.unplaced == (("m", 2),)
    assert len({slot for _, _, slot in out.assignments}) == 2


STAGES = st.lists(
    st.builds(
        StageDemand,
        model_id=st.sampled_from(["a", "b", "c"]),
        stage_index=st.integers(0, 3),
        memory_bytes=st.integers(1, 40),
        throughput_rps=st.floats(0.1, 10.0),
        cv=st.floats(0.0, 4.0),
    ),
    max_size=10,
    unique_by=lambda s: (s.model_id, s.stage_index),
)


@settings(max_examples=100, deadline=None)
@given(stages=STAGES, capacities=st.lists(st.integers(0, 60), min_size=1, max_size=5))
def test_allocation_respects_memory_and_the_one_stage_per_model_per_slot_rule(
    stages: list[StageDemand], capacities: list[int]
) -> None:
    slots = tuple(SlotState(j, c) for j, c in enumerate(capacities))
    out = allocate_slots(stages, slots, MultiplexSettings())
    placed = {(m, i) for m, i, _ in out.assignments}
    assert placed | set(out.unplaced) == {(s.model_id, s.stage_index) for s in stages}
    assert not placed & set(out.unplaced)
    by_key = {(s.model_id, s.stage_index): s for s in stages}
    for slot in slots:
        here = [(m, i) for m, i, j in out.assignments if j == slot.slot_id]
        assert sum(by_key[k].memory_bytes for k in here) <= slot.free_memory_bytes
        assert len({m for m, _ in here}) == len(here)
    for key in out.unplaced:  # nothing was left out that still fitted somewhere
        stage = by_key[key]
        for slot in slots:
            here = [(m, i) for m, i, j in out.assignments if j == slot.slot_id]
            used = sum(by_key[k].memory_bytes for k in here)
            fits = slot.free_memory_bytes - used >= stage.memory_bytes
            assert not fits or any(m == stage.model_id for m, _ in here)


def test_affinity_prefers_the_most_recent_holder() -> None:
    history = [HostingRecord(1, 100.0), HostingRecord(2, 500.0), HostingRecord(3, 300.0)]
    gpus = {1: 2, 2: 2, 3: 2}
    assert choose_affinity_server(history, gpus, 600.0, 1, AffinitySettings()) == 2


def test_affinity_weighs_free_gpus_against_recency_and_skips_full_servers() -> None:
    s = AffinitySettings(temporal_weight=1.0, gpu_weight=0.5, decay_per_s=math.log(2) / 100)
    history = [HostingRecord(1, 500.0), HostingRecord(2, 400.0)]
    # Server 2 is 100 s staler (half the temporal score) but has 2 more free GPUs.
    assert affinity_score(history[1], 3, 500.0, s) == pytest.approx(0.5 + 1.5)
    assert choose_affinity_server(history, {1: 1, 2: 3}, 500.0, 1, s) == 2
    assert choose_affinity_server(history, {1: 1, 2: 3}, 500.0, 4, s) is None
    # An older record of the same server does not count against its newest one.
    repeat = [HostingRecord(1, 0.0), HostingRecord(1, 500.0), HostingRecord(2, 400.0)]
    assert choose_affinity_server(repeat, {1: 2, 2: 2}, 500.0, 1, s) == 1


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(SurgeError):
        MultiplexSettings(base_penalty=-1.0)
    with pytest.raises(SurgeError):
        AffinitySettings(decay_per_s=-1.0)
    with pytest.raises(SurgeError):
        allocate_slots([], (SlotState(0, 1), SlotState(0, 1)), MultiplexSettings())
