"""ParaServe §5 Fig. 6(b) in the simulator: the node prefetcher fetches the rest of the
model into host memory after a member's own part, and consolidation loads it from there."""

from dataclasses import replace

import numpy as np
import pytest

from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.sim.settings import SimSettings
from surge.sim.simulator import simulate
from surge.traces.request import make_trace


@pytest.mark.parametrize(
    ("consolidation", "kept"), [("predictor", 1), ("scale-up", 4)], ids=["predictor", "scale-up"]
)
def test_kept_members_prefetch_the_rest_and_load_it_from_host(consolidation, kept) -> None:
    """A fixed group of four fetches one request's model cold. The §6.1 window (one
    arrival) predicts one worker kept: only it prefetches; with `scale-up` all four do. Each
    kept member loads its rest from host memory, and consolidation keeps that many."""
    one = make_trace("one", [0.0], [1024], [16])
    system = replace(system_config("paraserve"), group_sizing="fixed", consolidation=consolidation)
    settings = SimSettings("paraserve-1", ("llama2-7b",), "paraserve", slo=Slo(100.0, 1.0))
    res = simulate(one, settings, system=system)
    assert np.all(res.done_s > 0)
    assert max(n for _, n in res.gpu_changes) == 4  # the group: four parts fetched at once
    assert res.prefetches == kept and res.prefetch_hits == kept, (res.prefetches, kept)
    (count,) = [n for _, _, kind, n in res.scale_events if kind == "consolidate"]
    assert count == kept
