"""`policy.flexpipe.merge`: which engine decodes each sequence a FlexPipe merge
retires (Alg. 1 line 15: the new configuration serves the in-flight sequences)."""

import pytest

from surge.errors import SurgeError
from surge.policy.flexpipe.merge import MergeMove, SeqPhase, adoptions, merge_move, phase_of
from surge.policy.flexpipe.settings import FlexPipeSettings


def test_a_busy_4_to_1_merge_moves_every_sequence_to_the_engine_that_stays() -> None:
    assert adoptions([1], [1, 1, 1], 8) == ((0, 0, 0), (1, 0, 0), (2, 0, 0))


def test_each_joins_the_active_engine_holding_the_fewest() -> None:
    assert adoptions([2, 0], [2], 8) == ((0, 0, 1), (0, 1, 1))


def test_those_no_engine_has_room_for_stay() -> None:
    assert adoptions([2, 3], [2, 2], 3) == ((0, 0, 0),)
    assert adoptions([3], [4], 3) == ()


def test_bad_inputs_raise() -> None:
    for args in (([], [1], 1), ([1], [1], 0), ([1], [-1], 2)):
        with pytest.raises(SurgeError):
            adoptions(*args)


def test_the_paper_default_batches_and_the_counterfactual_is_named() -> None:
    assert FlexPipeSettings().batch_merged_sequences
    assert not FlexPipeSettings(batch_merged_sequences=False).batch_merged_sequences


def test_a_sequence_partway_through_its_prefill_moves_after_it() -> None:
    # FlexPipe §6.3: the inference goes on where it is until its K/V is there; then it
    # is a decoding one (Alg. 1 line 15's new configuration takes it).
    assert phase_of(True, 9) is SeqPhase.PREFILLING  # pieces cached, 9 tokens to go
    assert merge_move(SeqPhase.PREFILLING) is MergeMove.AFTER_PREFILL
    assert phase_of(True, 1) is SeqPhase.DECODING
    assert merge_move(SeqPhase.DECODING) is MergeMove.JOIN_NOW
    assert phase_of(False, 12) is SeqPhase.QUEUED
    assert merge_move(SeqPhase.QUEUED) is MergeMove.QUEUE_NOW
    with pytest.raises(SurgeError):
        phase_of(True, 0)
