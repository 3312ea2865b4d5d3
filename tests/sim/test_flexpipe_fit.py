"""A new FlexPipe group of a model that the granularity asked for cannot hold (no cut that
coarse fits one GPU: §5 Eq. 2's memory bound) opens at the next finer granularity of
`stage_counts` that does, as a FlexPipe group: its stages known to the granularity loop,
routed and autoscaled to its pipeline target. Before, `choose_stages` gave None and the
simulator fell back to a fixed group of `pipeline_size` workers outside FlexPipe (no
stages, no target): OPT-66B on §9's 2-GPU A100 servers, asked for 2 stages, became such a
group (`benchmarks/paper/flexpipe/flexpipe_shared.py`: 5 of the CV-1 run's scale-outs)."""

import numpy as np

from surge.policy.flexpipe.groups import pipeline_target
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.flexpipe.slot_allocation import SlotState
from surge.policy.flexpipe.system import LayerProfile, choose_stages
from surge.policy.systems import system_config
from surge.sim.events import Priority
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.request import make_trace

PROFILE = LayerProfile(
    num_layers=8, prefill_s=0.01, decode_s=0.002, param_bytes=100, activation_bytes=10, hop_s=0.001
)


def test_a_new_pipeline_too_coarse_to_fit_goes_finer() -> None:
    free = [SlotState(g, 450) for g in range(8)]
    settings = FlexPipeSettings()  # stage counts 1, 2, 4, 8
    # 450 bytes per slot hold 4 layers of 100 at most: 1 stage cannot, 2 can
    got = choose_stages(PROFILE, 1, (), free, 0.0, 100.0, 450, settings)
    assert got is not None and got.num_stages == 2
    assert got.bounds[0][0] == 0 and got.bounds[-1][1] == 8
    # a refactoring (slots kept) is never made finer than asked: none fits, so none
    assert choose_stages(PROFILE, 1, (0,), free, 0.0, 100.0, 450, settings) is None
    # held at one stage (no finer granularity to go to), or no layer fits a slot: none
    held = FlexPipeSettings(stage_counts=(1,), cv_targets=(0.0,))
    assert choose_stages(PROFILE, 1, (), free, 0.0, 100.0, 450, held) is None
    assert choose_stages(PROFILE, 1, (), free, 0.0, 100.0, 50, settings) is None


def test_opt66b_on_two_gpu_servers_opens_as_a_flexpipe_group() -> None:
    config = system_config("flexpipe")
    trace = make_trace("burst", np.linspace(0.0, 2.0, 6), np.full(6, 512), np.full(6, 16))
    settings = SimSettings("flexpipe", ("opt-66b",), "flexpipe", max_batch=8)
    sim = Simulation(trace, settings, config)
    seen: dict[int, tuple] = {}

    def probe() -> None:
        for pool in sim.pools.values():
            for inst in pool.instances:
                spans = sim.flexpipe.spans.get(inst.id)
                seen[inst.id] = (len(inst.placement.workers), spans, inst.route_target)
        if sim.router.unfinished:
            sim.world.loop.schedule(sim.world.loop.now_s + 0.5, Priority.SAMPLE, 0, probe)

    sim.world.loop.schedule(0.1, Priority.SAMPLE, 0, probe)
    res = sim.run()
    assert (res.done_s >= 0).all()
    assert seen
    for workers, spans, target in seen.values():
        assert spans is not None and len(spans) == workers > 1
        assert target == pipeline_target(config.autoscale, workers)
