"""λScale §4.3 Case 2 in the simulator: a model on two GPUs per instance, scaled out 1 -> 2
by λScale's binomial multicast (whole blocks to each receiver's lead GPU): each block's
other shard crosses the machine's link as the block lands, so a receiver holds complete
blocks (both shards) before it runs a pipeline stage with them, and holds the whole model
on both GPUs the moment its last block's shard is in (no whole-model fan-out after it)."""

from dataclasses import replace

import pytest

from surge.policy.multicast.nvlink_replication import shards_per_block
from surge.policy.systems import system_config
from surge.sim import multicast_load
from surge.sim.flows import FlowNetwork
from surge.sim.loading import Loader
from surge.sim.placement import Placement
from tests.parity.sim_world import entry_pool, simulation

BLOCKS = 4
SYSTEM = replace(system_config("lambdascale"), num_blocks=BLOCKS, max_sources=1)


def test_each_block_is_sharded_as_it_lands(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert shards_per_block(shard_multicast=False, gpus_per_member=2)
    assert not shards_per_block(shard_multicast=True, gpus_per_member=2)  # BlitzScale
    assert not shards_per_block(shard_multicast=False, gpus_per_member=1)
    events: list[tuple[float, str, object]] = []
    start, ready = FlowNetwork.start, Loader.ready

    def recording(self, links, size, on_done):
        if links[0].name.startswith("intra/"):

            def landed() -> None:
                events.append((self_world[0].loop.now_s, "shard", size))
                on_done()

            return start(self, links, size, landed)
        return start(self, links, size, on_done)

    def whole(self, pool, inst, delay_s=0.0):
        events.append((self.world.loop.now_s, "ready", inst.id))
        return ready(self, pool, inst, delay_s)

    monkeypatch.setattr(FlowNetwork, "start", recording)
    monkeypatch.setattr(Loader, "ready", whole)
    multicast_load._plan.cache_clear()
    sim = simulation(tmp_path, SYSTEM, 3, "registry", gpus_per_node=2, hidden_size=512)
    self_world = [sim.world]
    pool = entry_pool(sim)

    def instance(machine: int):
        first = sim.world.state.machines[machine].first_gpu
        return sim.loader.make_endpoint(pool, Placement(((first, first + 1),), machine), False)

    source = instance(0)
    source.loaded = source.serving = True
    pool.instances.append(source)
    new = [instance(1), instance(2)]
    pool.instances.extend(new)
    sim.loader.load(pool, new)
    sim.world.loop.run()
    block_bytes = -(-sim.world.models[0].profile.total_bytes // BLOCKS)
    shards = [e for e in events if e[1] == "shard"]
    assert len(shards) == BLOCKS * len(new)  # one shard per block per receiver
    assert all(size == pytest.approx(block_bytes / 2, abs=1) for _, _, size in shards)
    ups = [t for t, kind, _ in events if kind == "ready"]
    assert len(ups) == len(new) and max(ups) <= shards[-1][0] + 1e-9  # no fan-out after
