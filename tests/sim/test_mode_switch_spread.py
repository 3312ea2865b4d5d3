"""λScale §4.4 in the simulator: a retired execution pipeline's unfinished requests are
spread evenly over its members (`policy.loading.spread_evenly`), each member taking its
share once its own instance serves, instead of going back to the pool's queue."""

from dataclasses import replace

from surge.policy.systems import system_config
from surge.sim.request import SimRequest
from tests.parity.sim_world import entry_pool, instance_on, simulation

SYSTEM = replace(system_config("lambdascale"), num_blocks=4, max_sources=1)


def test_a_retired_pipelines_requests_wait_for_their_member_not_the_queue(tmp_path) -> None:
    sim = simulation(tmp_path, SYSTEM, 4, "registry")
    pool = entry_pool(sim)
    other = instance_on(sim, 0, serving=True)  # a source with room: the router's pick
    a = instance_on(sim, 1, serving=True)
    b = instance_on(sim, 2, serving=False)  # whole, its engine still starting
    reqs = [SimRequest(i, 0, 0.0, 16, 4) for i in range(5)]
    sim.loader.requests.unfinished += len(reqs)
    sim.loader.actions.mode_switch.spread_retired(pool, list(reversed(reqs)), [a, b])
    assert a.outstanding == 3 and b.outstanding == 0  # a: requests 0, 2, 4
    assert other.outstanding == 0 and not pool.queue
    sim.loader.ready(pool, b)  # b serves: its share (1, 3) starts there
    assert b.outstanding == 2
    sim.world.loop.run()
    assert all(r.done_s >= 0 for r in reqs)


def test_a_share_whose_member_was_given_back_returns_to_the_queue(tmp_path) -> None:
    sim = simulation(tmp_path, SYSTEM, 3, "registry")
    pool = entry_pool(sim)
    a = instance_on(sim, 1, serving=False)
    b = instance_on(sim, 2, serving=False)
    reqs = [SimRequest(i, 0, 0.0, 16, 4) for i in range(4)]
    sim.loader.actions.mode_switch.spread_retired(pool, reqs, [a, b])
    b.released = True
    sim.loader.ready(pool, b)  # given back before it served: its share is not lost
    assert [r.id for r in pool.queue] == [1, 3]
