"""λScale §4.3 Case 3 in the simulator: a 1 -> 8 scale-out onto two machines of four GPUs
(each machine's GPUs share one NIC) brings each block into each machine once, over its
NIC, and replicates it to the machine's other GPUs over the machine's fast link; the
receivers hold the model sooner than when every GPU receives over the network (the plain
binomial, Case 1 on every GPU, measured in the same test)."""

from dataclasses import replace

import pytest

from surge.policy.multicast import scale_out
from surge.policy.systems import system_config
from surge.sim import multicast_load
from surge.sim.flows import FlowNetwork
from surge.sim.loading import Loader
from tests.parity.sim_world import entry_pool, instance_on, simulation

SYSTEM = replace(system_config("lambdascale"), num_blocks=8, max_sources=1)


def _scale_out(tmp_path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, float], float]:
    """Model copies into each machine's NIC, and when the last receiver held the model."""
    into: dict[str, int] = {}
    ups: list[float] = []
    start, ready = FlowNetwork.start, Loader.ready

    def recording(self, links, size, on_done):
        last = links[-1].name
        if last.startswith("nic-in/"):
            into[last] = into.get(last, 0) + size
        return start(self, links, size, on_done)

    def whole(self, pool, inst, delay_s=0.0):
        ups.append(self.world.loop.now_s)
        return ready(self, pool, inst, delay_s)

    monkeypatch.setattr(FlowNetwork, "start", recording)
    monkeypatch.setattr(Loader, "ready", whole)
    multicast_load._plan.cache_clear()  # plans are cached by request
    tmp_path.mkdir()
    sim = simulation(tmp_path, SYSTEM, 3, "registry", gpus_per_node=4, hidden_size=512)
    pool = entry_pool(sim)
    instance_on(sim, 0, serving=True)
    new = [instance_on(sim, m, serving=False, gpu_index=g) for m in (1, 2) for g in range(4)]
    pool.instances.extend(new)
    sim.loader.load(pool, new)
    sim.world.loop.run()
    assert len(ups) == len(new)
    total = sim.world.models[0].profile.total_bytes
    return {link: size / total for link, size in into.items()}, max(ups)


def test_each_machine_takes_one_copy_over_its_nic(tmp_path, monkeypatch) -> None:
    copies, case3_s = _scale_out(tmp_path / "case3", monkeypatch)
    assert copies == {"nic-in/1": pytest.approx(1.0), "nic-in/2": pytest.approx(1.0)}
    monkeypatch.setattr(scale_out, "replicates_over_nvlink", lambda k, cluster: False)
    plain, plain_s = _scale_out(tmp_path / "plain", monkeypatch)
    assert min(plain.values()) > 1.5  # every GPU a network node: more copies per NIC
    assert case3_s < 0.6 * plain_s, (case3_s, plain_s)  # 0.077 s vs 0.197 s when written
