"""BlitzScale §6's deployments as blitzscale_eval.py and blitzscale_figs.py run them: §6.1's
three workloads, the rule that picks their rate scale ("handled"), the clusters as the
paper's logical hosts, DistServe's fixed deployment and §6.1's systems (every one P/D
with BlitzScale's monitor, only where weights come from differs).

In: a workload's cluster preset and GPUs per logical host; a rate check's results. Out:
`ClusterProfile`s, `SystemConfig`s, the largest handled rate scale.
"""

from dataclasses import replace

from surge.policy.systems import system_config
from surge.sim.hardware import cluster_from_spec, cluster_spec

WORKLOADS = (
    # (name, model, trace, rate scale, cluster preset, GPUs per logical host)
    # 7B on 32 one-GPU hosts (§6.2: "For 7 B and 8 B workloads, we use 1-GPU for each
    # host, allowing us to simulate a larger cluster with 32 and 16 hosts"): cluster A's
    # 32 GPUs. x2: §6.1 scales each trace "such that the peak incoming rate can be handled
    # by all the instances"; at x2 the 7B peak takes 30-32 of the 32 GPUs (`rate_sensitivity`).
    ("7b-azurecode", "llama2-7b", "azure-code", 2.0, "blitzscale-a", 1),
    ("8b-azureconv", "llama3-8b", "azure-conv", 1.0, "blitzscale-b", 1),
    # 70B on 8 four-GPU hosts: x0.19, the largest scale on PEAK_GRID that all 8 instances,
    # always on (`distserve`), handle (HANDLED_SLO_ATTAINMENT within §3's SLO, `peak_check`):
    # x0.4 (chosen at the simulator's default 5-s TTFT until 2026-11-28) serves 86.1%
    ("70b-azurecode", "llama2-70b", "azure-code", 0.19, "blitzscale-a", 4),
)
"""§6.1's three workloads (Fig. 13: 7B, 8B and 70B). BurstGPT, the paper's third trace,
is not in shared/traces: the 70B workload replays Azure code instead."""


HANDLED_SLO_ATTAINMENT = 0.98
"""§6.1 scales each trace "such that the peak incoming rate can be handled by all the
instances—otherwise autoscaling cannot help" and states no threshold (§6.2 says only that
DistServe (full), every instance always on, does not violate the SLO). "Handled", the same
for every workload: every instance always on from t = 0 (`peak_check`) serves at least this
share of requests within §3's SLO (`paper_slo`), the level the 7B's x2 and 8B's x1 meet
(98.8%, 99.9%) rounded down to a whole percent. An assumption, not the paper's number."""

PEAK_GRID = {
    "70b-azurecode": (0.15, 0.16, 0.17, 0.18, 0.19, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 1.0)
}
"""Rate scales at which `peak_check` also runs a workload's all-on deployment: the 70B's
0.05 steps, in 0.01 steps where they cross HANDLED_SLO_ATTAINMENT (x0.15 handled, x0.2
97.98%). Below x0.2 the 1,200-s window holds less of the trace (x0.15: its first 63
requests; x0.05 and x0.1 the same 63). The 7B's and 8B's scales (chosen first, the 7B's by
its autoscaled peak taking the 32 GPUs) are checked, not searched."""


def largest_handled(by_scale: dict) -> float | None:
    """The largest rate scale in `peak_check`'s `by_scale` whose all-on deployment meets
    HANDLED_SLO_ATTAINMENT, or None."""
    ok = [float(x) for x, v in by_scale.items() if v["slo_attainment"] >= HANDLED_SLO_ATTAINMENT]
    return max(ok, default=None)


SSD_GBPS_PER_GPU = 10.0
"""Table 1 / §6.1: "our cluster only supports a 10 Gbps per-GPU bandwidth, so a 4-GPU 70 B
instance needs 28 seconds to load the parameters"."""


def logical_hosts(preset: str, gpus_per_host: int) -> object:
    """The preset's GPUs as logical hosts of `gpus_per_host` GPUs, each with its share of
    the machine's host memory and NIC (the paper's own method, §6.2: 1-GPU hosts for
    7B/8B, 4-GPU hosts for 70B) and SSD_GBPS_PER_GPU per GPU (until 2026-11-27 10 Gb/s per
    host: a 4-GPU 70B host loaded in 112 s, not the paper's 28)."""
    spec = cluster_spec(preset)
    g = spec["groups"][0]
    per = g["gpus_per_node"] // gpus_per_host
    group = {
        **g,
        "num_nodes": g["num_nodes"] * per,
        "gpus_per_node": gpus_per_host,
        "host_memory_gib": g["host_memory_gib"] / per,
        "nic_gbps": g["nic_gbps"] / per,
        "ssd_gbps": SSD_GBPS_PER_GPU * gpus_per_host,
    }
    return cluster_from_spec(f"{preset}/{gpus_per_host}-gpu-hosts", {"groups": [group]})


def distserve(instances: int):
    """DistServe: BlitzScale's P/D serving on a fixed set of `instances` (§6.2: "DistServe
    cannot dynamically adjust the instances"), roles as the P/D policy gives them as they
    join (`policy.blitzscale.pd.role_for_new`), no mutation."""
    blitz = system_config("blitzscale")
    fixed = {"min_replicas": instances, "max_replicas": instances}
    return replace(
        blitz, name="distserve", mutation=False, autoscale=replace(blitz.autoscale, **fixed)
    )


def systems_6_1(sllm_init_s: float | None = None) -> dict:
    """§6.1: every system runs P/D disaggregated with BlitzScale's monitor (same
    autoscaler settings); only where weights come from differs. ServerlessLLM keeps its
    default 5-minute keep-alive (§6.2) and loads from SSD on a miss; AllCache is "the
    optimal version of ServerlessLLM that always load the parameters from the host cache"
    (§6): S-LLM with every load a hit, the same engine start (`init_s`, which the paper
    does not give: `sllm_init_s` overrides the shipped 0.5 s for both)."""
    blitz = system_config("blitzscale")
    same = {
        "pd_disaggregation": True,
        "autoscale": blitz.autoscale,
    }
    sllm = replace(system_config("serverlessllm"), keep_alive_s=300.0, **same)
    if sllm_init_s is not None:
        sllm = replace(sllm, init_s=sllm_init_s)
    allcache = replace(sllm, name="allcache", load="allcache", host_cache="all", keep_alive_s=None)
    return {"blitzscale": blitz, "serverlessllm": sllm, "allcache": allcache}
