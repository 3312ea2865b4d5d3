"""FlexPipe §7 Eq. 12's S_j parity: a new group's load time, which sets its stage count
(`policy.flexpipe.system.scale_out_num_stages`), is the model over the best tier the
candidate nodes hold (`policy.flexpipe.scaling_load.new_group_load_s`) in `surge serve`
(`runtime/scaleout/flexpipe.choose_pipeline`: the destination and spares' own tiers) and
in the simulator (`sim/flexpipe.FlexPipe.shape`: the free GPUs' host caches, else the
model store). Before, the runtime always charged the registry link and the simulator
always PCIe: at FlexPipe §9 CV 8 the emulated runtime's first new group was 4 stages and
the simulator's 2 (docs/emulation.md).

Node i of the runtime is machine i of the simulator (one GPU each): PCIe 100 Gbit/s, the
NIC (the registry link) and SSD 10."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from surge.policy.flexpipe.scaling_load import TierRates, new_group_load_s, new_group_tier
from surge.policy.multicast.topology import NodeLinks
from surge.policy.systems import system_config
from surge.runtime.clock import REAL_CLOCK
from surge.runtime.scaleout import flexpipe as runtime_flexpipe
from surge.runtime.scaleout.context import ControllerHooks
from surge.runtime.scaleout.estimates import ServingEstimates
from surge.sim import flexpipe as sim_flexpipe
from tests.parity.sim_world import add_host_copy, entry_pool, simulation

NUM_NODES = 4
SYSTEM = replace(system_config("flexpipe"), num_blocks=8)
RATES = {"host": 100.0, "disk": 10.0, "remote": 10.0}


def _recording(seen: list[float]):
    def record(arrivals, queue, profile, deadline_s, model_load_s, *rest, **kw):
        seen.append(model_load_s)
        return 1

    return record


def _runtime_load_s(tiers: list[str], total_bytes: int) -> float:
    manifest = SimpleNamespace(
        arch=SimpleNamespace(num_layers=8, hidden_size=64), total_bytes=total_bytes
    )
    nodes = [SimpleNamespace(node=n, machine=None, own_tier=t) for n, t in enumerate(tiers)]
    ctx = SimpleNamespace(
        manifest=manifest,
        system=SYSTEM,
        server=SimpleNamespace(arrivals=[], queue=[], clock=REAL_CLOCK),
        ttft_slo_s=5.0,
        fetch_gbps=RATES["remote"],
        estimates=ServingEstimates(host_gbps=RATES["host"], disk_gbps=RATES["disk"]),
        destinations=tuple(nodes[:1]),
        spares=tuple(nodes[1:]),
        hosted_s={},
        links={n: NodeLinks(host=f"h{n}") for n in range(NUM_NODES)},
        hooks=ControllerHooks(on_local=None),  # type: ignore[arg-type]
    )
    seen: list[float] = []
    with pytest.MonkeyPatch().context() as mp:
        mp.setattr(runtime_flexpipe, "scale_out_num_stages", _recording(seen))
        runtime_flexpipe.choose_pipeline(ctx, 0, list(range(1, NUM_NODES)))  # type: ignore[arg-type]
    return seen[0]


def _sim_load_s(host_copies: list[int], store: str, tmp_path) -> tuple[float, int]:
    sim = simulation(tmp_path, SYSTEM, NUM_NODES, store)
    for m in host_copies:
        add_host_copy(sim, m)
    seen: list[float] = []
    with pytest.MonkeyPatch().context() as mp:
        mp.setattr(sim_flexpipe, "scale_out_num_stages", _recording(seen))
        sim.flexpipe.shape(entry_pool(sim))
    return seen[0], sim.world.models[0].profile.total_bytes


@pytest.mark.parametrize(
    "host_copies,store,tier",
    [
        ([0, 1, 2, 3], "registry", "host"),
        ([2], "registry", "host"),
        ([], "registry", "remote"),
        ([], "ssd", "disk"),
    ],
    ids=["host copies everywhere", "one host copy", "registry only", "disk copies"],
)
def test_both_bodies_load_a_new_group_from_the_same_tier(
    host_copies: list[int], store: str, tier: str, tmp_path
) -> None:
    sim_s, total_bytes = _sim_load_s(host_copies, store, tmp_path)
    own = "disk" if store == "ssd" else "remote"
    tiers = ["host" if n in host_copies else own for n in range(NUM_NODES)]
    runtime_s = _runtime_load_s(tiers, total_bytes)
    assert runtime_s == pytest.approx(sim_s)
    assert sim_s == pytest.approx(total_bytes * 8 / (RATES[tier] * 1e9))


def test_the_best_tier_wins() -> None:
    rates = TierRates(host_gbps=100.0, disk_gbps=20.0, remote_gbps=5.0)
    assert new_group_tier(["remote", "disk"]) == "disk"
    assert new_group_tier(["remote", "host", "disk"]) == "host"
    assert new_group_tier([]) == "remote"
    assert new_group_load_s(10**9, ["disk", "remote"], rates) == pytest.approx(0.4)
    with pytest.raises(Exception, match="tiers must be among"):
        new_group_tier(["gpu"])
