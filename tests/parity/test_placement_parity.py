"""Placement parity: the same cluster (which nodes hold the model in host memory) asked for
new instances of each strategy `surge serve` runs puts them on the same nodes in
`surge serve` (`control/autoscaler.Autoscaler._scale_out`) and in the simulator
(`sim/scaling.Scaler.place`): both call `policy.placement.place` with the input
`policy.placement.prefers_host_copy` gives for the system. Node i is machine i."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from surge.control.pool import ParameterPool
from surge.control.settings import ControllerConfig
from surge.policy.systems import SYSTEMS, serve_system, system_config
from tests.control.scripted import bare_autoscaler
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import add_host_copy, entry_pool, simulation

NUM_MACHINES = 4
HOSTS = (1, 3)
"""Machines holding the model in host memory."""
SERVED = tuple(n for n, s in SYSTEMS.items() if s.serve)


def _runtime_nodes(strategy: str, count: int) -> list[int]:
    pool = ParameterPool()
    pool.add_model("m", 4)
    for n in HOSTS:
        pool.add("m", n, "host", range(4))
    config = ControllerConfig(state_dir=Path("/nonexistent"))
    autoscaler = bare_autoscaler(config, FakeClient(), pool, range(NUM_MACHINES), started_s=0.0)
    dep = SimpleNamespace(
        name="m",
        spec=SimpleNamespace(strategy=strategy, system=serve_system(strategy)),
        instances={},
        multicasting=False,
        num_scale_outs=0,
        spawn=lambda coro: coro.close(),  # the scale-out itself is not under test
    )
    autoscaler._scale_out(dep, count)  # type: ignore[arg-type]
    return list(dep.instances)


def _sim_nodes(strategy: str, count: int, tmp_path: Path) -> list[int]:
    sim = simulation(tmp_path, system_config(strategy), NUM_MACHINES, "registry")
    for m in HOSTS:
        add_host_copy(sim, m)
    placed = sim.scaler.place(entry_pool(sim), count, 1)
    return [sim.world.state.machine_of_gpu[gpus[0]].index for gpus in placed]


@pytest.mark.parametrize("strategy", SERVED)
@pytest.mark.parametrize("count", [1, 2, 3])
def test_both_bodies_place_new_instances_on_the_same_nodes(
    strategy: str, count: int, tmp_path: Path
) -> None:
    runtime = _runtime_nodes(strategy, count)
    assert runtime == _sim_nodes(strategy, count, tmp_path)
    assert len(runtime) == count


def test_the_host_copy_input_matters_here(tmp_path: Path) -> None:
    """The scenario tells the two rules apart: a system that prefers host copies and one
    that does not place the first instances differently."""
    assert _runtime_nodes("lambdascale", 2) == list(HOSTS)
    assert _runtime_nodes("paraserve", 2) == [0, 1]
