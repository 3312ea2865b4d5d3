"""Checks of paraserve_eval.py's deployment against sentences of the ParaServe paper.

- `sllm_start_check`: §8.2, "For smaller models, such as OPT-6.7B, ParaServe with single
  worker even achieves a short[er] cold start latency than ServerlessLLM with cached
  models", measured for each ServerlessLLM engine start that §8.3's sensitivity runs
  (`SLLM_STARTS`, and the scenario's 6.8 s beside the load): one 7B cold start on testbed
  (i)'s A10 servers (Llama-2 7B for OPT-6.7B: 13.5 vs 13.3 GB), ParaServe as one worker vs
  ServerlessLLM with the model in host memory; a start the sentence allows leaves
  ServerlessLLM the slower. 13B on the V100 servers beside it ("for smaller models": the
  sentence does not claim the larger one).
- `simulated_tpot_s`: the simulator's 13B decode step at Table 1's batch on a V100 (the
  profile decodes at Table 1's 58 ms since 2026-11-29: tests/sim/test_paraserve_table1_profiles.py).

In: nothing (presets). Out: dicts that paraserve_eval.py writes into its JSON.
"""

from dataclasses import replace

from common import run

from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.sim.costs import cost_model
from surge.sim.hardware import (
    ClusterProfile,
    cluster_from_spec,
    cluster_spec,
    gpu_profile,
)
from surge.sim.metrics import ttft_s
from surge.sim.models import load_model
from surge.sim.scenario import load_scenario
from surge.sim.settings import SimSettings
from surge.traces.request import make_trace

SLLM_STARTS = (("0.5s_after", 0.5, False), ("4.0s_beside", 4.0, True), ("10.0s_beside", 10.0, True))
"""ServerlessLLM engine starts beside the scenario's (6.8 s beside its load, §8.2's lower
bound): (label, seconds, beside the load). 0.5 s after was the shipped start, 4.0 s is
serverless vLLM's; 10 s beside is one start above the bound."""
TABLE1_TPOT_S = 0.058
"""ParaServe Table 1: Llama-2 13B on V100, warm TPOT at batch 8 with 1024-token inputs."""
TABLE1_BATCH = 8
LOOSE = Slo(1000.0, 10.0)


def _testbed1(gpu: str) -> ClusterProfile:
    spec = cluster_spec("paraserve-1")
    groups = [g for g in spec["groups"] if g["gpu"] == gpu]
    return cluster_from_spec(f"paraserve-1/{gpu}", {"groups": groups})


def _cold_ttft_s(cluster: ClusterProfile, model: str, system: str, cfg) -> float:
    one = make_trace("one", [0.0], [512], [64])
    settings = SimSettings(cluster, (model,), system, slo=LOOSE, kv_memory_fraction=1.0)
    _, res = run(one, settings, cfg)
    return float(ttft_s(res)[0])


def sllm_start_check() -> dict:
    """§8.2's sentence (module docstring) under each ServerlessLLM start."""
    sllm = load_scenario("paraserve-e2e").system("serverlessllm")
    starts = (("6.8s_beside", sllm.init_s, sllm.init_overlaps_load), *SLLM_STARTS)
    one_worker = replace(system_config("paraserve"), group_sizing="fixed", pipeline_size=1)
    out: dict = {}
    for gpu, model in (("A10", "llama2-7b"), ("V100", "llama2-13b")):
        cluster = _testbed1(gpu)
        para = _cold_ttft_s(cluster, model, "paraserve", one_worker)
        row: dict = {"paraserve_one_worker_ttft_s": para, "serverlessllm_cached_ttft_s": {}}
        for label, init_s, beside in starts:
            # "with cached models": every host holds the model (§8.1: S-LLM caches in memory)
            cfg = replace(sllm, init_s=init_s, init_overlaps_load=beside, host_cache="all")
            row["serverlessllm_cached_ttft_s"][label] = _cold_ttft_s(
                cluster, model, "serverlessllm", cfg
            )
        row["serverlessllm_slower"] = {
            k: v > para for k, v in row["serverlessllm_cached_ttft_s"].items()
        }
        out[f"{model}_{gpu}"] = row
    out["allowed_by_8_2"] = out["llama2-7b_A10"]["serverlessllm_slower"]
    return out


def simulated_tpot_s() -> float:
    """The simulator's 13B decode step at Table 1's batch on a V100."""
    return cost_model(load_model("llama2-13b"), gpu_profile("V100")).decode_s(TABLE1_BATCH)
