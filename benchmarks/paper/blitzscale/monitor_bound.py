"""BlitzScale's SLOs and load monitor in the reproductions (§3, §5.3).

In: a model name, a system's config. Out: the SLO the paper sets for that model
(`paper_slo`: BlitzScale's load monitor profiles its per-instance bounds against it,
`policy.blitzscale.monitor`, and its live scaling checks it, §4) and, for the measured
counterfactual, the config with the monitor as surge shipped it until 2026-11-28
(`in_flight_monitor`: 8 requests in flight per instance, every system's unsourced bound,
beside 2,000 tokens/s and 0.8 KV use).
"""

from dataclasses import replace

from surge.policy.blitzscale.monitor import bounds
from surge.policy.slo import BLITZSCALE_SLOS, Slo
from surge.sim.costs import monitor_costs
from surge.sim.models import load_model
from surge.sim.settings import SimSettings

SLO_8B_FROM = "llama2-7b"
"""§3 gives SLOs for Llama2-7B and 70B only ("based on inference speed of different
models"); Llama3-8B, one GPU per instance like the 7B and of about its inference speed,
takes the 7B's (an assumption, named in the rows)."""


def paper_slo(model: str) -> Slo:
    """The SLO BlitzScale's evaluation holds `model` to (§3; the 8B: `SLO_8B_FROM`'s)."""
    return BLITZSCALE_SLOS.get(model, BLITZSCALE_SLOS[SLO_8B_FROM])


def in_flight_monitor(cfg):
    """`cfg` with the load monitor surge shipped until 2026-11-28: requests in flight count
    (8 per instance, `policy/systems._AUTOSCALE`, unsourced) and nothing is profiled; 2,000
    generated tokens/s and 0.8 KV use per instance."""
    a = cfg.autoscale
    old = replace(
        a,
        count_in_flight=True,
        profile_bounds=False,
        target_ongoing_requests=8.0,
        target_tokens_per_s=2000.0,
        target_prefill_tokens_per_s=None,
        prefill_within_s=None,
    )
    return replace(cfg, autoscale=old)


def profiled_bounds(model: str, cluster, tp: int = 1) -> dict:
    """The monitor's per-instance bounds for `model` on the cluster's GPUs as the simulator
    profiles them (`sim/costs.monitor_costs`, the default engine limits), for the JSON."""
    limits = SimSettings(cluster, (model,), "blitzscale")
    gpu = cluster.groups[0].gpu
    costs = monitor_costs(load_model(model), gpu, tp, limits.max_prefill_tokens, limits.max_batch)
    slo = paper_slo(model)
    b = bounds(costs, slo)
    return {
        "ttft_slo_s": slo.ttft_s,
        "tpot_slo_s": slo.tpot_s,
        "prefill_tokens_per_s": b.prefill_tokens_per_s,
        "prompt_tokens_within_slo": b.prefill_tokens_per_s * slo.ttft_s,
        "decode_tokens_per_s": b.decode_tokens_per_s,
        "decode_batch": b.decode_batch,
    }
