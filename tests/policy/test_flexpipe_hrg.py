"""FlexPipe §7's Hierarchical Resource Graph (`policy/flexpipe/hrg.py`) as
`system.choose_stages` carries it out: a pipeline's new stages go to one server when one
takes them, else the fewest servers (a refactoring's own server first), stages of one
server adjacent; servers marked by a recent scaling event come last; a level that gains
nothing leaves Eq. 6 / Eq. 13 their choice. Each case is also run with the HRG off
(`HrgSettings(enabled=False)`: Eq. 6's choice among equals, the lowest slot ids), which is
what choose_stages did before the HRG."""

import itertools
from dataclasses import replace

import pytest

from surge.policy.flexpipe.hrg import HrgSettings, HrgView, ScalingMark, hrg_domains
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.flexpipe.slot_allocation import HostingRecord, SlotState
from surge.policy.flexpipe.stage_placement import Affinity
from surge.policy.flexpipe.system import LayerProfile, choose_stages

PROFILE = LayerProfile(8, 0.01, 0.001, 100, 10, 0.001)
ON = FlexPipeSettings()
OFF = replace(ON, hrg=HrgSettings(enabled=False))
SLOT_BYTES = 10**6


def _choose(eta, kept, free, server, settings, marks=(), now_s=0.0, history=()):
    slots = [SlotState(s, SLOT_BYTES) for s in free]
    affinity = None if kept else Affinity(tuple(history), server, now_s)
    view = HrgView(server, marks=tuple(marks), now_s=now_s)
    choice = choose_stages(
        PROFILE, eta, kept, slots, 1.0, 100, SLOT_BYTES, settings, affinity, view
    )
    assert choice is not None and choice.num_stages == eta
    return choice.slots


def _crossings(slots, server) -> int:
    return sum(server[a] != server[b] for a, b in itertools.pairwise(slots))


def test_a_new_group_takes_one_server_when_one_has_room() -> None:
    server = {0: 0, 2: 1, 3: 1, 6: 3}  # server 0 and 3 have one free GPU, server 1 two
    assert _choose(2, [], [0, 6, 2, 3], server, OFF) == (0, 2)  # Eq. 6: lowest ids
    assert _choose(2, [], [0, 6, 2, 3], server, ON) == (2, 3)


def test_a_refactoring_splits_onto_its_own_server() -> None:
    server = {5: 0, 9: 0, 1: 1, 2: 1}  # the pipeline runs on slot 5 (server 0)
    assert _choose(2, [5], [1, 2, 9], server, OFF) == (5, 1)
    assert _choose(2, [5], [1, 2, 9], server, ON) == (5, 9)  # PCIe/NVLink, not the NIC


def test_a_large_group_spans_the_fewest_servers_adjacent() -> None:
    server = {1: 2, 2: 3, 3: 4, 10: 0, 11: 0, 20: 1, 21: 1}
    free = [1, 2, 3, 10, 11, 20, 21]
    plain = _choose(4, [], free, server, OFF)
    placed = _choose(4, [], free, server, ON)
    assert set(placed) == {10, 11, 20, 21}
    assert _crossings(placed, server) == 1 < _crossings(plain, server) == 3


def test_recent_scaling_marks_steer_away_until_they_expire() -> None:
    server = {0: 0, 1: 0, 2: 1, 3: 1}
    mark = (ScalingMark(0, at_s=10.0),)
    window = ON.hrg.mark_window_s
    assert _choose(2, [], [0, 1, 2, 3], server, ON, mark, now_s=10.5) == (2, 3)
    assert _choose(2, [], [0, 1, 2, 3], server, ON, mark, now_s=10.0 + window + 0.1) == (0, 1)
    assert _choose(2, [], [0, 1, 2, 3], server, OFF, mark, now_s=10.5) == (0, 1)


def test_past_hosts_first_among_servers_that_fit() -> None:
    server = {0: 0, 1: 0, 2: 1, 3: 1}
    history = (HostingRecord(1, 9.0),)  # Eq. 13: server 1 hosted the model a second ago
    assert _choose(2, [], [0, 1, 2, 3], server, ON, now_s=10.0, history=history) == (2, 3)


def test_no_gain_leaves_eq6_and_eq13_their_choice() -> None:
    # surge serve without host groups: every node its own server, one slot each
    server = {n: n for n in range(7)}
    assert hrg_domains([0], [1, 2, 3, 4, 5, 6], 3, HrgView(server), ON.hrg) == ((1, 2, 3, 4, 5, 6),)
    history = (HostingRecord(6, 9.0), HostingRecord(5, 9.0))
    assert set(_choose(2, [], [1, 2, 3, 5, 6], server, ON, now_s=10.0, history=history)) == {5, 6}


def test_settings_are_validated() -> None:
    with pytest.raises(Exception, match="mark_window_s"):
        HrgSettings(mark_window_s=-1.0)
