"""`SimSettings.model_replicas`: a model's share of a shared cluster held fixed, as FlexPipe
§9's offline-configured baseline (AlpaServe) places several models on 82 GPUs once, while
the other models of the same run keep autoscaling."""

import numpy as np
import pytest

from benchmarks.systems.flexpipe_sim import quick_release
from surge.errors import SurgeError
from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.sim.events import Priority
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.gamma import gamma_arrivals
from surge.traces.request import make_trace

MODELS = ("llama2-7b", "llama2-13b")


def _trace():
    rng = np.random.default_rng(3)
    parts = [gamma_arrivals(rng, 6.0, 4.0, 60.0) for _ in MODELS]
    index = np.concatenate([np.full(len(p), i) for i, p in enumerate(parts)])
    arrival = np.concatenate(parts)
    n = len(arrival)
    return make_trace("two-models", arrival, np.full(n, 512), np.full(n, 128), index, MODELS)


def _groups_over_time(fixed: tuple[tuple[str, int], ...]) -> tuple[dict, list]:
    """Per model index, the instance counts seen every second, and the first sample's."""
    settings = SimSettings(
        "flexpipe", MODELS, "flexpipe", seed=1, slo=Slo(ttft_s=5.0, tpot_s=0.2),
        model_replicas=fixed,
    )  # fmt: skip
    # Groups released 2 s after they idle, no always-ready floor (`quick_release`): with
    # §9.4's 5-minute reclamation a 60-s trace never shows a group released.
    sim = Simulation(_trace(), settings, quick_release(system_config("flexpipe")))
    seen: dict[int, list[int]] = {0: [], 1: []}
    loaded_first: list[int] = []
    loop = sim.world.loop

    def probe() -> None:
        for pool in sim.pools.values():
            seen[pool.model].append(len(pool.instances))
        if not loaded_first:
            loaded_first.append(sum(i.loaded for i in sim.pools[(0, "both")].instances))
        if sim.router.unfinished:
            loop.schedule(loop.now_s + 1.0, Priority.SAMPLE, 2, probe)

    first_arrival = float(_trace().arrival_s[0])
    loop.schedule(first_arrival + 30.0, Priority.SAMPLE, 2, probe)
    res = sim.run()
    assert (res.done_s >= 0).all()
    return seen, loaded_first


def test_a_fixed_share_holds_its_groups_while_the_other_model_autoscales() -> None:
    seen, _ = _groups_over_time((("llama2-7b", 3),))
    assert set(seen[0]) == {3}, seen[0]  # never more, never fewer
    assert len(set(seen[1])) > 1, seen[1]  # the other model of the same run still scales
    free, _ = _groups_over_time(())
    assert len(set(free[0])) > 1, free[0]  # without the share the same model scales


def test_a_fixed_share_loads_at_time_zero() -> None:
    """The share is asked for at time 0, not at the first arrival."""
    settings = SimSettings(
        "flexpipe", MODELS, "flexpipe", seed=1, model_replicas=(("llama2-13b", 2),)
    )
    trace = _trace()
    late = make_trace(
        "late", trace.arrival_s + 120.0, trace.input_tokens, trace.output_tokens,
        trace.model_index, MODELS,
    )  # fmt: skip
    sim = Simulation(late, settings)
    counts: list[int] = []
    sim.world.loop.schedule(
        119.0, Priority.SAMPLE, 2,
        lambda: counts.append(sum(i.loaded for i in sim.pools[(1, "both")].instances)),
    )  # fmt: skip
    sim.run()
    assert counts == [2]


@pytest.mark.parametrize(
    "fixed, match",
    [
        ((("llama2-70b", 2),), "not in the run"),
        ((("llama2-7b", 0),), ">= 1"),
        ((("llama2-7b", 1), ("llama2-7b", 2)), "once"),
    ],
)
def test_bad_shares_are_refused(fixed, match) -> None:
    with pytest.raises(SurgeError, match=match):
        Simulation(_trace(), SimSettings("flexpipe", MODELS, "flexpipe", model_replicas=fixed))
