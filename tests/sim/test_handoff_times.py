"""The simulator's per-request P/D hand-off times (`SimResult.handoffs`) and decode instance
(`SimResult.decode_instance`), and BlitzScale §6.1's TBT split built on them
(benchmarks/paper/blitzscale/tbt_measure.handoff_split)."""

import sys
from pathlib import Path

import numpy as np
import pytest

from surge.sim.metrics import tpot_s
from surge.sim.settings import SimSettings
from surge.sim.simulator import simulate
from surge.traces.gamma import gamma_trace
from surge.traces.request import make_trace

PAPER_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
sys.path[0:0] = [str(PAPER_DIR), str(PAPER_DIR / "blitzscale")]

from tbt_measure import handoff_split  # noqa: E402


@pytest.fixture(scope="module")
def blitz():
    # one request alone (a prefill and a decode instance start for it), a burst 3 s later
    # long enough prompts that the §5.2 SLO check asks for live scaling
    burst = gamma_trace(40, 4.0, 60.0, 0, input_tokens=2048, output_tokens=64)
    trace = make_trace(
        "lone-then-burst",
        np.r_[0.0, burst.arrival_s + 3.0],
        np.r_[512, burst.input_tokens],
        np.r_[64, burst.output_tokens],
    )
    return simulate(trace, SimSettings("blitzscale-b", ("llama2-7b",), "blitzscale"))


def test_handoff_times_are_ordered_and_name_the_decode_instance(blitz):
    r, h = blitz, blitz.handoffs
    handed = h.handoff_s >= 0
    assert handed.sum() > 0
    assert (h.parked_s[handed] >= r.first_token_s[handed]).all()
    assert (h.handoff_s[handed] >= h.parked_s[handed]).all()
    assert (h.kv_arrived_s[handed] >= h.handoff_s[handed]).all()
    assert (h.decode_joined_s[handed] >= h.kv_arrived_s[handed]).all()
    assert (r.done_s[handed] >= h.decode_joined_s[handed]).all()
    # the lone request: its K/V crossed the network to another instance, which decoded it
    assert h.kv_arrived_s[0] > h.handoff_s[0]
    assert r.decode_instance[0] >= 0 and r.decode_instance[0] != r.endpoint[0]
    # decoded in place: named, "arrived" and joined at once, on the instance it ran on
    for i in r.decoded_in_place:
        assert h.handoff_s[i] == h.kv_arrived_s[i] == h.decode_joined_s[i]
    assert (r.decode_instance[r.done_s >= 0] >= 0).all()


def test_no_handoff_without_pd():
    trace = gamma_trace(10, 2.0, 20.0, 0, input_tokens=256, output_tokens=16)
    r = simulate(trace, SimSettings("lambdascale-testbed1", ("llama2-13b",), "lambdascale"))
    assert (r.handoffs.handoff_s == -1).all() and (r.handoffs.parked_s == -1).all()
    done = r.done_s >= 0
    # one instance serves a request whole: the one the router gave it to (none requeued)
    assert (r.decode_instance[done] == r.endpoint[done]).all()


def test_tbt_parts_sum_to_the_mean_tbt(blitz):
    parts = handoff_split(blitz)
    keys = ("wait_decode_full_s", "wait_decode_loading_s", "kv_transfer_s")
    keys += ("decode_queue_s", "decode_steps_s", "decoded_where_prefilled_s")
    assert sum(parts[k] for k in keys) == pytest.approx(float(tpot_s(blitz).mean()))
    assert parts["kv_transfer_s"] > 0 and parts["handed_off"] > 0


def test_live_batches_record_their_source_role(blitz):
    roles = {b.source_role for b in blitz.live_batches}
    assert blitz.live_batches and None not in roles
    assert roles == {"prefill"}  # under P/D only prefill instances cooperate (§5.2)
