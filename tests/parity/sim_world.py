"""A small simulated cluster for parity tests: N machines of one GPU, one tiny model."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from surge.policy.copies.keepalive import CacheEntry
from surge.policy.systems import SystemConfig
from surge.sim.instance import Instance, Placement
from surge.sim.pools import Pool
from surge.sim.request import SimRequest
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.request import Trace


def simulation(
    tmp_path: Path,
    system: SystemConfig,
    num_machines: int,
    store: str,
    model_layers: tuple[int, ...] = (8,),
    seed_host_copies: bool = False,
    hidden_size: int = 64,
    gpu_speedup: float = 1.0,
    gpus_per_node: int = 1,
) -> Simulation:
    """A simulation of `system` on `num_machines` machines whose model store is `store`
    (`ssd`: every machine has a disk copy; `registry`: none), serving one tiny model per
    entry of `model_layers` (its layer count: the sizes differ); the system's host copies
    are seeded only with `seed_host_copies`; `hidden_size` sets the models' size,
    `gpu_speedup` multiplies the GPU's compute and memory bandwidth; `gpus_per_node` GPUs
    share each machine's NIC and its fast link."""
    gpu = {
        "name": "g", "memory_gib": 8, "tflops": 1, "mem_bandwidth_gbs": 1,
        "prefill_efficiency": 1, "decode_efficiency": 1, "layer_overhead_s": 0,
    }  # fmt: skip
    gpu["tflops"] *= gpu_speedup
    gpu["mem_bandwidth_gbs"] *= gpu_speedup
    group = {
        "num_nodes": num_machines, "gpu": gpu, "gpus_per_node": gpus_per_node, "nic_gbps": 10,
        "intra_gpu_gbps": 100, "pcie_gbps": 100, "ssd_gbps": 10, "host_memory_gib": 16,
        "model_store": store,
    }  # fmt: skip
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"groups": [group]}))
    models = []
    for i, layers in enumerate(model_layers):
        name = "tiny" if i == 0 else f"tiny{i}"
        model = tmp_path / f"{name}.json"
        model.write_text(
            json.dumps(
                {"name": name, "num_layers": layers, "hidden_size": hidden_size,
                 "intermediate_size": 2 * hidden_size,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
                 "context_tokens": 512, "dtype_bytes": 4}
            )
        )  # fmt: skip
        models.append(str(model))
    trace = Trace(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    settings = SimSettings(str(cluster), tuple(models), system.name)
    return Simulation(
        trace, settings, system if seed_host_copies else replace(system, host_cache="none")
    )


def add_host_copy(sim: Simulation, machine: int) -> None:
    """Model 0 in `machine`'s host memory."""
    slot = sim.world.models[0]
    entry = CacheEntry(slot.name, slot.profile.total_bytes, 0.0, True)
    sim.world.state.host_cache[machine][slot.name] = entry
    sim.world.state.cached_machines.add(machine)


def entry_pool(sim: Simulation) -> Pool:
    """Model 0's pool (under P/D too: its instances take roles)."""
    return sim.pools[(0, "both")]


def instance_on(sim: Simulation, machine: int, serving: bool, gpu_index: int = 0) -> Instance:
    """A new instance of model 0 on `machine`'s GPU `gpu_index` (a serving one joins the
    pool)."""
    pool = entry_pool(sim)
    gpu = sim.world.state.machines[machine].first_gpu + gpu_index
    inst = sim.loader.make_endpoint(pool, Placement(((gpu,),), machine), False)
    if serving:
        inst.loaded = inst.serving = True
        pool.instances.append(inst)
    return inst


def busy_partner(
    tmp_path: Path,
    system: SystemConfig,
    num_layers: int,
    own_tokens: int,
    output_tokens: int,
    share: float,
) -> tuple[Instance, SimRequest]:
    """A serving instance on machine 0 (of two) prefilling one request of its own
    (`own_tokens`) and the loop run `share` of that step (a live batch's partner, busy):
    the instance and its request."""
    sim = simulation(tmp_path, system, 2, "registry", (num_layers,))
    partner = instance_on(sim, 0, serving=True)
    own = SimRequest(0, 0, 0.0, own_tokens, output_tokens)
    partner.submit_many([own])
    sim.world.loop.run(until_s=share * partner.cost.prefill_s(own_tokens))
    return partner, own
