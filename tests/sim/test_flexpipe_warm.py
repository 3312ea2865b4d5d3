"""A FlexPipe instance serving at time 0 (`SimSettings.warm_instances`) is a one-stage
group, as the runtime's first FlexPipeline is (`[(node, 0, L)]`): the `pack` router fills
it to a one-stage pipeline's target and the granularity loop sees it. Before, it was a
plain instance outside the loop, with no routing target (the emulated FlexPipe §9
scenario, `benchmarks/emulation/flexpipe.py`, starts from one such instance)."""

from dataclasses import replace

from surge.policy.flexpipe.groups import pipeline_target
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.systems import system_config
from surge.sim.events import Priority
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.request import make_trace


def test_warm_flexpipe_instance_is_a_one_stage_group() -> None:
    config = system_config("flexpipe")
    config = replace(config, autoscale=replace(config.autoscale, target_ongoing_requests=4.0))
    trace = make_trace("one", [0.5], [64], [4])
    settings = SimSettings("flexpipe", ("llama2-7b",), "flexpipe", warm_instances=1, max_batch=8)
    sim = Simulation(trace, settings, config)
    seen: list[tuple] = []

    def probe() -> None:  # before the first arrival: only the warm instance
        for pool in sim.pools.values():
            seen.extend(
                (i.id, i.route_target, sim.flexpipe.spans.get(i.id)) for i in pool.instances
            )

    sim.world.loop.schedule(0.1, Priority.SAMPLE, 0, probe)
    sim.run()
    ((_, target, spans),) = seen
    layers = sim.world.models[0].profile.num_layers
    assert spans is not None and len(spans) == 1 and spans[0][1] == (0, layers)
    assert target == pipeline_target(config.autoscale, 1) == 4.0


def test_warm_instance_of_a_system_held_at_four_stages_is_a_four_stage_group() -> None:
    """The runtime's static-4 opens its first pipeline over four nodes; so does the
    simulator's warm instance (its first stage on its own GPU, the rest on free ones)."""
    config = system_config("flexpipe")
    held = FlexPipeSettings(stage_counts=(4,), cv_targets=(0.0,))
    config = replace(config, flexpipe=held)
    settings = SimSettings("flexpipe", ("llama2-7b",), "flexpipe", warm_instances=1, max_batch=8)
    sim = Simulation(make_trace("one", [0.5], [64], [4]), settings, config)
    seen: list[tuple] = []

    def probe() -> None:
        for pool in sim.pools.values():
            seen.extend((i, sim.flexpipe.spans.get(i.id)) for i in pool.instances)

    sim.world.loop.schedule(0.1, Priority.SAMPLE, 0, probe)
    sim.run()
    ((inst, spans),) = seen
    layers = sim.world.models[0].profile.num_layers
    assert len(spans) == 4 and spans[0][1][0] == 0 and spans[-1][1][1] == layers
    assert len({g for g, _ in spans}) == 4 == len(inst.placement.workers)
