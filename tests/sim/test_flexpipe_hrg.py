"""FlexPipe §7's HRG in the simulator: a new two-stage group goes to the machine that
holds both its stages (Eq. 6 alone takes the lowest free GPUs, across two machines), so
its activations and a later refactoring's layer and K/V copies stay on the machine's
link; the placement is marked for the HRG's next decisions."""

from dataclasses import replace

import pytest

from surge.policy.flexpipe.hrg import HrgSettings
from surge.policy.systems import system_config
from surge.sim import flexpipe as sim_flexpipe
from tests.parity.sim_world import entry_pool, simulation

SYSTEM = replace(system_config("flexpipe"), num_blocks=8)


def _shape(tmp_path, system, monkeypatch: pytest.MonkeyPatch):
    # three machines of two GPUs (10 Gbit/s NIC, 100 Gbit/s inside); GPUs 1, 4, 5 busy
    tmp_path.mkdir()
    sim = simulation(tmp_path, system, 3, "registry", (8,), gpus_per_node=2)
    sim.gpus.take((1, 4, 5))
    monkeypatch.setattr(sim_flexpipe.FlexPipe, "_scale_out_num_stages", lambda self, pool: 2)
    shaped = sim.flexpipe.shape(entry_pool(sim))
    assert shaped is not None
    return sim, tuple(g for g, _ in shaped[2])


def test_a_new_group_takes_the_machine_that_holds_it(tmp_path, monkeypatch) -> None:
    sim, slots = _shape(tmp_path / "hrg", SYSTEM, monkeypatch)
    assert slots == (2, 3)  # machine 1 holds both stages
    link = sim.world.state.gpu_to_gpu(*slots)
    assert [x.name for x in link] == ["intra/3"]  # stage to stage inside the machine
    assert [m.server_id for m in sim.flexpipe.marks] == [1]  # §7: its path is marked
    off = replace(SYSTEM, flexpipe=replace(SYSTEM.flexpipe, hrg=HrgSettings(enabled=False)))
    _, plain = _shape(tmp_path / "plain", off, monkeypatch)
    assert plain == (0, 2)  # Eq. 6 alone: the lowest free GPUs, across the network
