"""FlexPipe cut-and-place parity (§5 Eq. 2, §6.2 Eq. 6, §7 Eq. 13): a new group of the
same model, asked for the same number of stages with the same free nodes and no hosting
history, gets the same layers on the same nodes in `surge serve`
(`runtime/scaleout/flexpipe.choose_pipeline`: the destination runs the first stage, the
spares the rest) and in the simulator (`sim/flexpipe.FlexPipe.shape`): both carry out
`policy.flexpipe.system.choose_stages`, which also falls back to a coarser cut when the
free nodes cannot take the stages asked for.

The stage count is each body's `scale_out_num_stages` (a decision of its own, one brain
already); here both are handed the same count, and the runtime the layer profile the
simulator's cost model gives (the runtime measures its own on the nodes), so the cut and
the placement are compared. Node i of the runtime is machine i of the simulator (one GPU
each, links of the same speed)."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from surge.policy.flexpipe.system import LayerProfile
from surge.policy.systems import system_config
from surge.runtime.clock import REAL_CLOCK
from surge.runtime.scaleout import flexpipe as runtime_flexpipe
from surge.runtime.scaleout.estimates import HOST_ESTIMATES
from surge.sim import flexpipe as sim_flexpipe
from tests.parity.sim_world import entry_pool, simulation

NUM_LAYERS = 8
SYSTEM = replace(system_config("flexpipe"), num_blocks=NUM_LAYERS)


def _runtime_choice(
    free: list[int], eta: int, profile: LayerProfile
) -> list[tuple[int, tuple[int, int]]]:
    total_bytes = profile.param_bytes * NUM_LAYERS
    manifest = SimpleNamespace(
        arch=SimpleNamespace(num_layers=NUM_LAYERS, hidden_size=64), total_bytes=total_bytes
    )
    ctx = SimpleNamespace(
        manifest=manifest,
        system=SYSTEM,
        server=SimpleNamespace(arrivals=[], queue=[], clock=REAL_CLOCK),
        ttft_slo_s=5.0,
        fetch_gbps=10.0,
        estimates=HOST_ESTIMATES,
        destinations=(SimpleNamespace(node=free[0], machine=None),),
        spares=tuple(SimpleNamespace(node=n, machine=None) for n in free[1:]),
        hosted_s={},
    )
    patch = pytest.MonkeyPatch()
    with patch.context() as mp:
        mp.setattr(runtime_flexpipe, "scale_out_num_stages", lambda *a, **k: eta)
        mp.setattr(runtime_flexpipe, "layer_profile", lambda *a, **k: profile)
        choice = runtime_flexpipe.choose_pipeline(ctx, free[0], free[1:])  # type: ignore[arg-type]
    return list(zip(choice.slots, choice.bounds, strict=True))


def _sim_choice(
    free: list[int], eta: int, tmp_path
) -> tuple[list[tuple[int, tuple[int, int]]] | None, LayerProfile]:
    num_machines = max(free) + 1
    sim = simulation(tmp_path, SYSTEM, num_machines, "registry", (NUM_LAYERS,))
    busy = [m for m in range(num_machines) if m not in free]
    sim.gpus.take(tuple(sim.world.state.machines[m].first_gpu for m in busy))
    patch = pytest.MonkeyPatch()
    with patch.context() as mp:
        mp.setattr(sim_flexpipe.FlexPipe, "_scale_out_num_stages", lambda self, pool: eta)
        shaped = sim.flexpipe.shape(entry_pool(sim))
    profile = sim.flexpipe._profile(0)
    if shaped is None:
        return None, profile
    machine = sim.world.state.machine_of_gpu
    return [(machine[g].index, bounds) for g, bounds in shaped[2]], profile


@pytest.mark.parametrize(
    "free,eta",
    [([0, 1, 2, 3], 2), ([0, 1, 2, 3], 4), ([1, 3], 4), ([2], 2)],
    ids=["two stages", "four stages", "coarser: two nodes for four stages", "one node"],
)
def test_both_bodies_cut_and_place_a_new_group_alike(free: list[int], eta: int, tmp_path) -> None:
    sim, profile = _sim_choice(free, eta, tmp_path)
    runtime = _runtime_choice(free, eta, profile)
    assert runtime == sim
    assert [m for m, _ in runtime] == free[: len(runtime)]
    assert runtime[0][1][0] == 0 and runtime[-1][1][1] == NUM_LAYERS
    assert len(runtime) == min(eta, len(free))
