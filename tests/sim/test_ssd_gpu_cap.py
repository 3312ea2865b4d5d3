"""A GPU's SSD load under a per-GPU SSD-GPU cap (BlitzScale Table 1's "SSD-GPU 10 Gbps",
§6.1: "our cluster only supports a 10 Gbps per-GPU bandwidth, so a 4-GPU 70 B instance
needs 28 seconds"): a lone load on a machine reads at the cap, not at the machine's whole
SSD bandwidth; without the cap only the machine's link bounds it."""

from dataclasses import replace

import pytest

from surge.errors import SurgeError
from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.sim.hardware import cluster_from_spec, cluster_spec
from surge.sim.models import load_model
from surge.sim.settings import SimSettings
from surge.sim.simulator import simulate
from surge.traces.request import make_trace

MODEL = "llama2-7b"


def _cluster(cap: float | None):
    g = cluster_spec("blitzscale-a")["groups"][0]
    group = {**g, "num_nodes": 1, "ssd_gbps": 80.0, "ssd_gpu_gbps": cap}
    return cluster_from_spec(f"one-a800-machine/{cap}", {"groups": [group]})


def _cold_first_token_s(cap: float | None) -> float:
    """One request on a pool at zero: ServerlessLLM with no host cache reads from SSD."""
    sllm = replace(system_config("serverlessllm"), host_cache="none", init_s=0.0)
    one = make_trace("one", [0.0], [16], [1])
    settings = SimSettings(_cluster(cap), (MODEL,), "serverlessllm", slo=Slo(100.0, 1.0))
    res = simulate(one, settings, system=sllm)
    return float(res.first_token_s[0] - res.arrival_s[0])


def test_a_lone_ssd_load_reads_at_the_per_gpu_cap():
    read_s = load_model(MODEL).total_bytes * 8 / 10e9
    capped = _cold_first_token_s(10.0)
    uncapped = _cold_first_token_s(None)
    assert capped == pytest.approx(read_s, rel=0.05)
    # without the cap the machine's 80 Gb/s serves the one load alone: 8x faster
    assert uncapped < capped / 4


def test_the_cap_must_be_positive():
    with pytest.raises(SurgeError):
        _cluster(0.0)
