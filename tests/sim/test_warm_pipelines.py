"""λScale §5 warm start in the simulator: instances whose machines hold the model in host
memory load it in rotated orders and serve as an execution pipeline while they load,
then each serves alone (`policy.warm_pipelines`, `sim/warm_load.py`)."""

from dataclasses import replace

from surge.policy.systems import system_config
from surge.sim.request import SimRequest
from tests.parity.sim_world import add_host_copy, entry_pool, instance_on, simulation

SYSTEM = replace(system_config("lambdascale"), num_blocks=4)


def _warm_start(tmp_path, mode: str) -> tuple[list, list[SimRequest], list]:
    """Three warm instances come up with four requests waiting: (pipelines opened as
    (time, stages), the requests, the instances)."""
    tmp_path.mkdir()
    system = replace(SYSTEM, serve_while_loading=mode)
    # 8 layers of hidden 4096: ~3 GB, ~0.25 s host -> GPU at 100 Gbit/s; a GPU fast
    # enough that loading, not compute, decides when the first token comes
    sim = simulation(tmp_path, system, 3, "registry", hidden_size=4096, gpu_speedup=1000.0)
    pool = entry_pool(sim)
    for m in range(3):
        add_host_copy(sim, m)
    new = [instance_on(sim, m, serving=False) for m in range(3)]
    pool.instances.extend(new)
    opened: list[tuple[float, int]] = []

    class Recording(list):
        def append(self, ep) -> None:
            opened.append((sim.world.loop.now_s, len(ep.placement.workers)))
            super().append(ep)

    pool.pipelines = Recording()
    reqs = [SimRequest(i, 0, 0.0, 16, 4) for i in range(4)]
    sim.loader.requests.unfinished += len(reqs)
    pool.queue.extend(reqs)
    sim.loader.load(pool, new)
    sim.world.loop.run()
    assert sim.world.result.cache_hits == 3  # each instance's host copy, counted once
    return opened, reqs, new


def test_warm_instances_serve_as_a_pipeline_before_any_holds_the_model(tmp_path) -> None:
    opened, reqs, new = _warm_start(tmp_path / "pipes", "pipelines")
    alone, alone_reqs, _ = _warm_start(tmp_path / "none", "none")
    assert [stages for _, stages in opened] == [3] and not alone  # one 3-stage pipeline
    assert all(i.serving and i.loaded for i in new)
    assert all(r.done_s > 0 for r in reqs + alone_reqs)
    # It serves from a third of the model: the first token comes before any instance
    # could hold the whole model (loading alone).
    first_alone_s = min(r.first_token_s for r in alone_reqs)
    assert opened[0][0] < first_alone_s
    assert min(r.first_token_s for r in reqs) < first_alone_s
