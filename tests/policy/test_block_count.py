"""Choosing B at the elbow of completion time vs B (λScale "selective block sizes")."""

import pytest

from surge.errors import SurgeError
from surge.policy.multicast.block_count import BlockCountSettings, choose_block_count, elbow_index

MODEL_BYTES = 13_000_000_000  # Llama-2 7B in fp16


def test_elbow_is_the_fewest_blocks_within_tolerance_of_the_best() -> None:
    assert elbow_index([10.0, 6.0, 5.2, 5.0, 5.1], 0.05) == 2
    assert elbow_index([10.0, 6.0, 5.2, 5.0, 5.1], 0.0) == 3
    assert elbow_index([3.0], 0.05) == 0


def test_choice_is_near_the_fastest_and_well_below_its_block_count() -> None:
    settings = BlockCountSettings(
        model_bytes=MODEL_BYTES, num_nodes=8, max_blocks=48, transfer_overhead_s=1e-4
    )
    choice = choose_block_count(settings)
    times = dict(choice.curve)
    best_blocks = min(times, key=lambda b: (times[b], b))
    assert times[choice.num_blocks] <= 1.05 * times[best_blocks]
    assert choice.num_blocks < best_blocks
    assert times[1] > 1.5 * times[choice.num_blocks]  # one block is far from the elbow


def test_more_overhead_moves_the_elbow_to_fewer_blocks() -> None:
    def chosen(overhead_s: float) -> int:
        settings = BlockCountSettings(
            model_bytes=MODEL_BYTES, num_nodes=16, max_blocks=40, transfer_overhead_s=overhead_s
        )
        return choose_block_count(settings, range(1, 41, 3)).num_blocks

    assert chosen(1e-2) < chosen(1e-4)


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(SurgeError):
        BlockCountSettings(model_bytes=0, num_nodes=4)
    with pytest.raises(SurgeError):
        BlockCountSettings(model_bytes=10, num_nodes=1)
    with pytest.raises(SurgeError):
        choose_block_count(BlockCountSettings(model_bytes=10, num_nodes=4, max_blocks=4), [8])
