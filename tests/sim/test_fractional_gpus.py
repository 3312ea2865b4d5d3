"""ParaServe's low-memory workers on fractional GPUs (ParaServe §4.1.1-§4.1.2, §9; issue 18).

A low-memory worker of an s-worker group holds 1/s of one GPU's memory and compute
(`policy.paraserve.gpu_share`); workers of several groups and models share a GPU within
its memory; a worker holding 1/s computes at 1/s; GPU-seconds count the share held;
freed shares return to the pool. Systems without low-memory workers do not change.
"""

from dataclasses import replace

import numpy as np
import pytest

from surge.policy.paraserve.gpu_share import (
    consolidation_gpu,
    low_memory_share,
    pick_gpu,
    pipeline_speed,
)
from surge.policy.paraserve.sizing import pipeline_slowdown
from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.sim.gpus import Gpus
from surge.sim.hardware import cluster_from_spec, cluster_spec
from surge.sim.metrics import gpu_seconds, summarize, tpot_s, ttft_s
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.gamma import gamma_trace
from surge.traces.request import make_trace

SLO = Slo(5.0, 0.2)
"""7B on an A10 at 16 Gb/s: one worker fetches too slowly for 5 s, two low-memory
workers meet it (Alg. 1 picks s = 2, w = 0)."""


def _a10s(num_nodes: int):
    spec = cluster_spec("paraserve-1")
    a10 = [{**g, "num_nodes": num_nodes} for g in spec["groups"] if g["gpu"] == "A10"]
    return cluster_from_spec(f"{num_nodes}-a10", {"groups": a10})


def _run(trace, fractional: bool, consolidation: str = "predictor", models=("llama2-7b*2",)):
    settings = SimSettings(_a10s(2), models, "paraserve", slo=SLO, fractional_gpus=fractional)
    sim = Simulation(
        trace, settings, replace(system_config("paraserve"), consolidation=consolidation)
    )
    return sim, sim.run(), settings


def _three_models():
    """Bursty arrivals (CV 4) over 2 minutes, spread over three models round-robin."""
    t = gamma_trace(0.5, 4.0, 120.0, 1, input_tokens=512, output_tokens=64)
    index = np.arange(t.num_requests) % 3
    return make_trace("three", t.arrival_s, t.input_tokens, t.output_tokens, index)


# --- the policy ---------------------------------------------------------------------
def test_low_memory_share_is_one_over_s_of_a_one_gpu_worker() -> None:
    assert low_memory_share(4, 1) == 0.25
    assert low_memory_share(2, 1) == 0.5
    assert low_memory_share(1, 1) is None  # a single worker is a full one
    assert low_memory_share(4, 2) is None  # a full worker needs two GPUs: whole GPUs


def test_pick_gpu_best_fit() -> None:
    free = ((0, 1.0), (1, 0.5), (2, 0.25))
    assert pick_gpu(free, 0.25) == 2  # the fullest GPU it fits on
    assert pick_gpu(free, 0.5) == 1
    assert pick_gpu(free, 0.75) == 0
    assert pick_gpu(((3, 0.2),), 0.25) is None
    assert pick_gpu(((5, 1 / 3), (4, 1 / 3)), 1 / 3) == 4  # ties: lowest id


def test_consolidation_grows_in_place_or_moves_to_a_free_gpu() -> None:
    assert consolidation_gpu(0, 0.5, ((0, 0.5), (1, 1.0))) == 0  # the rest of its GPU
    assert consolidation_gpu(0, 0.5, ((0, 0.25), (1, 1.0), (2, 1.0))) == 1  # shared: moves
    assert consolidation_gpu(0, 0.5, ((0, 0.25), (1, 0.75))) is None  # nowhere whole


def test_pipeline_speed_is_eq2s_factor() -> None:
    for s in (1, 2, 3, 4):
        for w in range(s + 1):
            shares = [1.0] * w + [1 / s] * (s - w)
            assert pipeline_speed(shares) == pytest.approx(1 / pipeline_slowdown(s, w))


# --- the simulator ------------------------------------------------------------------
def test_workers_of_two_models_pack_onto_shared_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two cold models at once on two one-GPU servers: whole GPUs give the first group
    both GPUs and the second waits; halves let both groups fetch and serve at once, two
    workers per GPU, no GPU over its memory."""
    held: list[tuple[int, float]] = []
    take_share = Gpus.take_share

    def recording(self: Gpus, gpu: int, share: float) -> None:
        take_share(self, gpu, share)
        held.append((gpu, self.world.state.gpu_used.get(gpu, 1.0)))

    monkeypatch.setattr(Gpus, "take_share", recording)
    trace = make_trace("two", [0.0, 0.0], [512, 512], [64, 64], [0, 1])
    sim, frac, _ = _run(trace, True, consolidation="none")
    assert max(u for _, u in held) <= 1.0 + 1e-9
    assert sorted(u for _, u in held).count(1.0) == 2  # both GPUs filled by two halves
    started = [t for t, _, kind, _ in frac.scale_events if kind == "scale-out"]
    assert len(started) == 2 and max(started) < 5.0, frac.scale_events
    held.clear()
    _, whole, _ = _run(trace, False, consolidation="none")
    assert not held
    assert max(ttft_s(whole)) > 2 * max(ttft_s(frac)), (ttft_s(whole), ttft_s(frac))
    assert max(n for _, n in whole.gpu_changes) == 2  # the second group waited
    # freed shares return to the pool: every GPU free at the end, nothing half-held
    assert not sim.world.state.gpu_used
    assert sim.world.state.free_gpus == set(sim.world.state.machine_of_gpu)


def test_a_low_memory_group_computes_at_its_quota() -> None:
    """Two workers holding half a GPU each serve a token at half the speed (Eq. 2:
    TPOT = 2 t_d), where whole-GPU workers serve at one worker's speed."""
    trace = make_trace("one", [0.0], [512], [256], [0])
    _, frac, _ = _run(trace, True, consolidation="none", models=("llama2-7b",))
    _, whole, _ = _run(trace, False, consolidation="none", models=("llama2-7b",))
    ratio = tpot_s(frac)[0] / tpot_s(whole)[0]
    assert 1.8 < ratio <= 2.0, ratio  # a stage hop per step is not slowed


def test_gpu_seconds_count_the_share_held() -> None:
    trace = make_trace("one", [0.0], [512], [256], [0])
    _, frac, settings = _run(trace, True, consolidation="none", models=("llama2-7b",))
    _, whole, _ = _run(trace, False, consolidation="none", models=("llama2-7b",))
    for res, per_s in ((frac, 1.0), (whole, 2.0)):  # two halves vs two whole GPUs
        (out,) = [t for t, _, k, _ in res.scale_events if k == "scale-out"]
        (rel,) = [t for t, _, k, _ in res.scale_events if k == "release"]
        assert max(n for _, n in res.gpu_changes) == per_s
        assert gpu_seconds(res) == pytest.approx(per_s * (rel - out))
    assert summarize(frac, settings)["gpu_seconds"] < summarize(whole, settings)["gpu_seconds"]


def test_a_consolidating_worker_takes_the_rest_of_its_gpu() -> None:
    """§6.1 scale-down: the kept half-GPU worker grows into its whole GPU, the other
    half is freed, and the instance then serves at full speed."""
    trace = make_trace("one", [0.0], [512], [512], [0])
    sim, res, _ = _run(trace, True, models=("llama2-7b",))
    assert [k for _, _, k, _ in res.scale_events].count("consolidate") == 1
    assert [n for _, n in res.gpu_changes][:4] == [0.5, 1.0, 1.5, 1.0]  # grow, then free
    assert not sim.world.state.gpu_used
    _, none, _ = _run(trace, True, consolidation="none", models=("llama2-7b",))
    assert tpot_s(res)[0] < 0.8 * tpot_s(none)[0]


@pytest.mark.parametrize("system", ["serverlessllm", "serverless-vllm", "lambdascale"])
def test_whole_gpu_systems_do_not_change(system: str) -> None:
    """Fractional GPUs are ParaServe's low-memory workers only: every other system's
    numbers are identical with them on or off (and ParaServe's differ)."""
    trace = _three_models()
    out = []
    for fractional in (True, False):
        settings = SimSettings(
            _a10s(2),
            ("llama2-7b*3",),
            system,
            slo=SLO,
            fractional_gpus=fractional,
        )
        s = summarize(Simulation(trace, settings).run(), settings)
        out.append({k: v for k, v in s.items() if k != "wall_s"})
    assert out[0] == out[1]
    assert out[0]["finished"] == out[0]["requests"] > 0


def test_paraserve_changes_with_fractional_gpus() -> None:
    trace = _three_models()
    gpu_s = []
    for fractional in (True, False):
        settings = SimSettings(
            _a10s(2),
            ("llama2-7b*3",),
            "paraserve",
            slo=SLO,
            fractional_gpus=fractional,
        )
        gpu_s.append(summarize(Simulation(trace, settings).run(), settings)["gpu_seconds"])
    assert gpu_s[0] != gpu_s[1]


def test_every_system_runs_a_model_on_the_card_that_holds_it() -> None:
    """ParaServe §8.1: every model resides in one card (13B on a V100); ParaServe's
    groups no longer take the first group whose GPUs hold a quarter of it (13B on A10s)."""
    trace = make_trace("one", [0.0], [16], [4], [0])
    groups = {}
    for system in ("paraserve", "serverlessllm"):
        settings = SimSettings(
            "paraserve-2", ("llama2-7b", "llama2-13b"), system, kv_memory_fraction=1.0
        )
        sim = Simulation(trace, settings)
        groups[system] = [(m.group.gpu.name, m.tp) for m in sim.world.models]
    assert groups["paraserve"] == groups["serverlessllm"] == [("A10", 1), ("V100", 1)]


def test_a_group_with_no_room_for_its_shares_does_not_start() -> None:
    """With fewer blocks than Alg. 1's s the group has fewer, larger parts: where the GPUs
    have room for 1/s but not for those, and no GPU is free, no group starts and Alg. 2
    forgets its workers (no crash, nothing held)."""
    trace = make_trace("one", [0.0], [512], [64], [0])
    settings = SimSettings(_a10s(4), ("llama2-7b",), "paraserve", slo=Slo(2.5, 0.2))
    config = replace(system_config("paraserve"), num_blocks=2)
    sim = Simulation(trace, settings, config)
    state = sim.world.state
    for gpu in list(state.free_gpus):
        sim.gpus.take_share(gpu, 0.7)  # 0.3 free on every GPU: room for 1/4, not 1/2
    assert sim.groups.start(sim.pools[(0, "both")], 1) == 0
    assert all(not n.workers for n in sim.groups.networks.values())
    assert all(used == pytest.approx(0.7) for used in state.gpu_used.values())
