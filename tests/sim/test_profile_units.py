"""Profile capacities are in the unit they are sold in: GPU and host memory in GiB."""

import pytest

from surge.errors import SurgeError
from surge.sim.hardware import GIB, gpu_profile, load_cluster
from surge.sim.models import load_model
from surge.sim.scenario import parse_scenario


def test_a_v100_is_32_gib_and_an_h800_80_gib():
    # a "32 GB" V100 holds 32 GiB = 34.36e9 B (the unit cards are sold and reported in)
    assert gpu_profile("V100").memory_bytes == 32 * 2**30 == 34_359_738_368
    assert gpu_profile("H800").memory_bytes == 80 * GIB
    assert gpu_profile("A10").memory_bytes == 24 * GIB


def test_host_memory_is_gib_and_lambdascale_hosts_hold_1_tib():
    # λScale Table 1: "Each node is equipped with 1TB RAM" (DRAM as sold: 1 TiB)
    group = load_cluster("lambdascale-testbed1").groups[0]
    assert group.host_memory_bytes == 1 << 40
    # ParaServe §8.1: A10 servers with 188GB memory (a cloud instance's GiB)
    assert load_cluster("paraserve-1").groups[0].host_memory_bytes == 188 * GIB
    # disks are sold in GB = 1e9 B
    assert group.disk_bytes == 4000 * 10**9


def test_model_weights_are_exact_bytes_and_13b_is_paraserves_24_2_gib():
    # ParaServe Table 1's "24.2GB" Llama-2 13B: 26.0e9 B, i.e. 24.2 GiB
    assert load_model("llama2-13b").total_bytes / GIB == pytest.approx(24.2, abs=0.05)


def test_an_old_gb_key_is_refused_with_its_new_name():
    inline = {"name": "g", "memory_gb": 8, "tflops": 1, "mem_bandwidth_gbs": 1}
    with pytest.raises(SurgeError, match="memory_gib"):
        gpu_profile(inline)
    doc = {
        "name": "s",
        "cluster": {"preset": "lambdascale-testbed1", "host_memory_gb": 40},
        "models": [{"name": "m", "profile": "llama2-7b", "arrivals": {"trace": "azure-code"}}],
        "duration_s": 60,
    }
    with pytest.raises(SurgeError, match="host_memory_gib"):
        parse_scenario(doc)
