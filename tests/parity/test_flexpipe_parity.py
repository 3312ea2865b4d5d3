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
from surge.policy.multicast.topology import NodeLinks
from surge.policy.systems import system_config
from surge.runtime.clock import REAL_CLOCK
from surge.runtime.scaleout import flexpipe as runtime_flexpipe
from surge.runtime.scaleout.context import ControllerHooks
from surge.runtime.scaleout.estimates import HOST_ESTIMATES
from surge.sim import flexpipe as sim_flexpipe
from surge.sim.flexpipe_sizes import layer_profile
from tests.parity.sim_world import entry_pool, simulation

NUM_LAYERS = 8
SYSTEM = replace(system_config("flexpipe"), num_blocks=NUM_LAYERS)


def _runtime_choice(
    free: list[int], eta: int, profile: LayerProfile, gpus_per_host: int = 1
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
        destinations=(SimpleNamespace(node=free[0], machine=None, own_tier="remote"),),
        spares=tuple(SimpleNamespace(node=n, machine=None, own_tier="remote") for n in free[1:]),
        hosted_s={},
        links={n: NodeLinks(host=f"h{n // gpus_per_host}") for n in range(8)},
        hooks=ControllerHooks(on_local=None),  # type: ignore[arg-type]
    )
    patch = pytest.MonkeyPatch()
    with patch.context() as mp:
        mp.setattr(runtime_flexpipe, "scale_out_num_stages", lambda *a, **k: eta)
        mp.setattr(runtime_flexpipe, "layer_profile", lambda *a, **k: profile)
        choice = runtime_flexpipe.choose_pipeline(ctx, free[0], free[1:])  # type: ignore[arg-type]
    return list(zip(choice.slots, choice.bounds, strict=True))


def _sim_choice(
    free: list[int], eta: int, tmp_path, gpus_per_node: int = 1
) -> tuple[list[tuple[int, tuple[int, int]]] | None, LayerProfile]:
    """The simulator's choice on machines of `gpus_per_node` GPUs, `free` the free GPUs (one
    per machine: machine ids, as GPU ids are then)."""
    num_machines = max(free) // gpus_per_node + 1
    sim = simulation(
        tmp_path, SYSTEM, num_machines, "registry", (NUM_LAYERS,), gpus_per_node=gpus_per_node
    )
    busy = [g for g in range(num_machines * gpus_per_node) if g not in free]
    sim.gpus.take(tuple(busy))
    patch = pytest.MonkeyPatch()
    with patch.context() as mp:
        mp.setattr(sim_flexpipe.FlexPipe, "_scale_out_num_stages", lambda self, pool: eta)
        shaped = sim.flexpipe.shape(entry_pool(sim))
    profile = layer_profile(sim.world, 0)
    if shaped is None:
        return None, profile
    if gpus_per_node > 1:
        return [(g, bounds) for g, bounds in shaped[2]], profile
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


@pytest.mark.parametrize(
    "free,eta,slots",
    [([0, 1, 2, 3], 2, [0, 1]), ([2, 0, 3], 2, [2, 3]), ([0, 1, 2, 3], 4, [0, 1, 2, 3])],
    ids=["one machine", "the destination's mate, not the lower node", "two whole machines"],
)
def test_both_bodies_keep_stages_inside_a_machine(
    free: list[int], eta: int, slots: list[int], tmp_path
) -> None:
    # FlexPipe §7's HRG: machines of two GPUs (the runtime: host groups of two nodes); GPU
    # and node n sit on machine n // 2 in both. The new stages take the destination's
    # machine-mate before a lower node elsewhere (Eq. 6 alone would take node 0).
    sim, profile = _sim_choice(free, eta, tmp_path, gpus_per_node=2)
    runtime = _runtime_choice(free, eta, profile, gpus_per_host=2)
    assert runtime == sim
    assert [g for g, _ in runtime] == slots
