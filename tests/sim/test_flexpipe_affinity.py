"""FlexPipe's affinity placement (§7 Eq. 13, `system.place_new_group`): a new
group goes to a machine that hosted the model lately when its stages fit there, in the
policy and in the simulator's scale-out."""

from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.flexpipe.slot_allocation import HostingRecord, SlotState
from surge.policy.flexpipe.system import place_new_group, place_stages
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.gamma import gamma_trace

GB = 1 << 30


def _slots(num_servers: int, per_server: int) -> tuple[list[SlotState], dict[int, int]]:
    slots = [SlotState(g, 40 * GB) for g in range(num_servers * per_server)]
    return slots, {g: g // per_server for g in range(num_servers * per_server)}


def test_a_new_group_goes_to_the_recent_host_when_it_fits() -> None:
    settings = FlexPipeSettings()
    slots, server_of = _slots(4, 4)
    stages = [5 * GB, 5 * GB]
    plain = place_stages("m", stages, 1.0, 1.0, slots, settings)
    assert plain is not None and {server_of[g] for g in plain} == {0}
    history = [HostingRecord(0, 10.0), HostingRecord(2, 95.0)]
    placed = place_new_group("m", stages, 1.0, 1.0, slots, server_of, history, 100.0, settings)
    assert placed is not None and {server_of[g] for g in placed} == {2}
    # the recent host has one free GPU left: the older host that fits is chosen
    few = [s for s in slots if server_of[s.slot_id] != 2 or s.slot_id == 8]
    placed = place_new_group("m", stages, 1.0, 1.0, few, server_of, history, 100.0, settings)
    assert placed is not None and {server_of[g] for g in placed} == {0}
    # no past host takes both stages, but past hosts have free GPUs: theirs first (one
    # on server 2, one on server 0), where Eq. 6 alone takes the lowest ids (servers 0, 1)
    split = [s for s in slots if s.slot_id in (3, 4, 5, 6, 7, 8)]
    placed = place_new_group("m", stages, 1.0, 1.0, split, server_of, history, 100.0, settings)
    assert placed is not None and sorted(server_of[g] for g in placed) == [0, 2]
    assert place_stages("m", stages, 1.0, 1.0, split, settings) == (3, 4)
    # no past host fits: Eq. 6 over every slot, as without a history
    none_fit = [s for s in slots if server_of[s.slot_id] in (1, 3)]
    placed = place_new_group("m", stages, 1.0, 1.0, none_fit, server_of, history, 100.0, settings)
    assert placed == place_stages("m", stages, 1.0, 1.0, none_fit, settings)


def _first_group_machines(hosted: dict[int, float] | None) -> set[int]:
    trace = gamma_trace(2.0, 1.0, 5.0, 1, input_tokens=512, output_tokens=16)
    sim = Simulation(trace, SimSettings("flexpipe", ("llama2-7b",), "flexpipe"))
    if hosted is not None:
        sim.flexpipe.hosted[0] = dict(hosted)
    sim.run()
    first = sim.flexpipe.spans[min(sim.flexpipe.spans)]
    return {sim.world.state.machine_of_gpu[g].index for g, _ in first}


def test_the_simulators_scale_out_places_by_affinity() -> None:
    default = _first_group_machines(None)
    assert len(default) == 1
    other = next(m for m in range(4) if m not in default)
    assert _first_group_machines({other: 0.0}) == {other}
