"""FlexPipe composed: stage count from the CV, layers, slots, refactoring plan."""

from dataclasses import replace

import pytest

from surge.errors import SurgeError
from surge.policy.flexpipe.granularity import GranularityState
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.flexpipe.slot_allocation import SlotState
from surge.policy.flexpipe.system import (
    LayerProfile,
    arrivals_in_window,
    candidates,
    choose_num_stages,
    choose_stages,
    place_stages,
    refactor,
    scale_out_num_stages,
    stage_layers,
    useful_stages,
)

PROFILE = LayerProfile(
    num_layers=8, prefill_s=0.01, decode_s=0.002, param_bytes=100, activation_bytes=10, hop_s=0.001
)
SETTINGS = FlexPipeSettings()


def test_finer_stages_for_burstier_arrivals():
    steady = [i * 1.0 for i in range(50)]
    bursty = [0.0] * 20 + [30.0] * 20 + [30.0 + 0.01 * i for i in range(10)] + [90.0]
    eta_steady, _ = choose_num_stages(steady, PROFILE, GranularityState(), SETTINGS)
    eta_bursty, _ = choose_num_stages(bursty, PROFILE, GranularityState(), SETTINGS)
    assert eta_steady == 1 and eta_bursty > eta_steady


def test_candidates_stop_at_the_layer_count_and_trade_latency_for_throughput():
    few = LayerProfile(2, 0.01, 0.002, 100, 10, 0.001)
    assert [c.num_stages for c in candidates(few, SETTINGS)] == [1, 2]
    cands = candidates(PROFILE, SETTINGS)
    assert cands[-1].throughput_rps > cands[0].throughput_rps
    assert cands[-1].latency_s > cands[0].latency_s


def test_stage_layers_cover_the_model_within_slot_memory():
    bounds = stage_layers(PROFILE, 4, 100.0, 250, SETTINGS)
    assert bounds[0][0] == 0 and bounds[-1][1] == 8 and len(bounds) == 4
    assert all(b - a <= 2 for a, b in bounds)  # 250 bytes hold 2 layers of 100
    with pytest.raises(SurgeError):
        stage_layers(PROFILE, 2, 100.0, 250, SETTINGS)


def test_stages_take_distinct_slots_or_none():
    slots = [SlotState(g, 1000) for g in (5, 6, 7)]
    placed = place_stages("m", [300, 300], 1.0, 0.5, slots, SETTINGS)
    assert placed is not None and len(set(placed)) == 2
    assert place_stages("m", [300, 300, 300, 300], 1.0, 0.5, slots, SETTINGS) is None


def test_refactor_moves_only_layers_whose_slot_changes():
    current = [(0, (0, 4)), (1, (4, 8))]
    target = [(0, (0, 2)), (1, (2, 4)), (2, (4, 6)), (3, (6, 8))]
    plan = refactor(current, target, [("r", 5)])
    assert {(m.block, m.src_slot, m.dst_slot) for m in plan.block_moves} == {
        (2, 0, 1), (3, 0, 1), (4, 1, 2), (5, 1, 2), (6, 1, 3), (7, 1, 3),
    }  # fmt: skip
    assert len(plan.kv_copies) == 6 and all(c.num_tokens == 5 for c in plan.kv_copies)


def test_measured_layer_times_move_the_cuts():
    """§5: with one slow layer, the balanced 2-stage cut isolates it (uniform: 4 + 4)."""
    assert stage_layers(PROFILE, 2, 100.0, 10_000, SETTINGS) == ((0, 4), (4, 8))
    slow_first = LayerProfile(8, 0.01, 0.002, 100, 10, 0.001, layer_prefill_s=(0.07,) + (0.01,) * 7)
    bounds = stage_layers(slow_first, 2, 100.0, 10_000, SETTINGS)
    assert bounds[0][1] < 4 and bounds[-1][1] == 8
    with pytest.raises(SurgeError):
        LayerProfile(8, 0.01, 0.002, 100, 10, 0.001, layer_prefill_s=(0.01,))


def test_arrivals_in_window_keeps_the_last_seconds_only():
    s = FlexPipeSettings(cv_window_s=5.0)
    assert arrivals_in_window([1.0, 4.0, 6.0, 10.0, 11.0], 10.0, s) == (6.0, 10.0)
    with pytest.raises(SurgeError):
        FlexPipeSettings(cv_window_s=0.0)


def test_choose_stages_keeps_the_running_slots_and_places_the_rest():
    free = [SlotState(7, 10_000), SlotState(9, 10_000)]
    split = choose_stages(PROFILE, 2, (3,), free, 4.0, 100.0, 10_000, SETTINGS)
    assert split is not None and split.slots[0] == 3 and split.slots[1] in (7, 9)
    assert split.bounds == ((0, 4), (4, 8))
    merge = choose_stages(PROFILE, 1, (3, 7), free, 0.0, 100.0, 10_000, SETTINGS)
    assert merge is not None and merge.slots == (3,) and merge.bounds == ((0, 8),)


def test_choose_stages_falls_back_to_a_coarser_granularity_without_free_slots():
    one_free = [SlotState(7, 10_000)]
    got = choose_stages(PROFILE, 8, (3,), one_free, 4.0, 100.0, 10_000, SETTINGS)
    assert got is not None and got.num_stages == 2 and got.slots == (3, 7)
    assert choose_stages(PROFILE, 4, (3,), [], 4.0, 100.0, 10_000, SETTINGS).num_stages == 1


def test_scale_out_goes_finer_with_a_bursty_queue_and_a_tight_deadline():
    """§7 Eq. 11/12: a steady model with no queue scales out as one stage; the same arrivals
    with a long queue and bursty traffic get more stages; a deadline the coarse start
    cannot meet (loading takes longer than the TTFT SLO) forces finer stages even when
    Eq. 11 alone says coarse."""
    steady = [i * 1.0 for i in range(30)]
    bursty = [0.0] * 15 + [20.0] * 15 + [29.0]
    calm = scale_out_num_stages(steady, 0, PROFILE, 5.0, 0.5, SETTINGS)
    assert calm == 1
    rushed = scale_out_num_stages(bursty, 64, PROFILE, 5.0, 0.5, SETTINGS)
    assert rushed > calm and rushed in SETTINGS.stage_counts
    # Loading the whole model takes 6 s, the deadline is 5 s: one stage cannot start in
    # time; 2 stages load 3 s each and serve the queued request within the deadline.
    slow_load = scale_out_num_stages(steady, 1, PROFILE, 5.0, 6.0, SETTINGS)
    assert slow_load == 2
    # Never finer than its hops are worth: with 10-ms hops a queue of 32 starts on one
    # stage (every finer shape adds more hop time than it saves loading), unless the
    # deadline needs more; never finer than the layers allow.
    slow_hops = replace(PROFILE, hop_s=0.01)
    assert scale_out_num_stages(bursty, 32, slow_hops, 5.0, 0.5, SETTINGS) == 1
    assert scale_out_num_stages(bursty, 32, slow_hops, 5.0, 6.0, SETTINGS) == 2
    few = LayerProfile(2, 0.01, 0.002, 100, 10, 0.001)
    assert scale_out_num_stages(bursty, 64, few, 0.1, 60.0, SETTINGS) == 2


def test_useful_stages_weighs_the_faster_start_against_the_hops():
    """§7 ①: m stages load 1/m of the model each but add m − 1 hops to every step. The
    §9 set-up (llama2-7b, 13.5 GB over 128 Gbit/s PCIe: 0.84 s; 128-token answers): a
    1-ms hop makes two stages best (0.42 + 0.13 s, against 0.84, 0.21 + 0.38 and 0.11 +
    0.90); a 0.1-ms hop eight (0.11 + 0.09 s); no hop the finest; a slow hop one."""
    assert useful_stages(0.84, 0.001, 128, 32, SETTINGS) == 2
    assert useful_stages(0.84, 0.0001, 128, 32, SETTINGS) == 8
    assert useful_stages(0.84, 0.0, 128, 32, SETTINGS) == 8
    assert useful_stages(0.84, 0.01, 128, 32, SETTINGS) == 1
    assert useful_stages(0.84, 0.0, 128, 3, SETTINGS) == 2  # the layers cap it
    # Shorter answers pay fewer hops: finer is worth it.
    assert useful_stages(0.84, 0.001, 16, 32, SETTINGS) == 8
