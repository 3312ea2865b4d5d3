"""Counterfactual for §6.1's rows: BlitzScale with P/D decode instances as live partners.

BlitzScale §5.2 pairs a live new instance with an *overloaded* instance, and under P/D live
scaling scales a prefill instance ("prefill-only serving"; §5.1 Fig. 11: its K/V "will be
transferred to the decode instances"), so only prefill instances cooperate
(`policy.blitzscale.live_scaling.cooperating`). Until 2026-11-29 any serving instance did,
decode ones too, which then decoded those requests behind their own prefills, and each
batch ran on the least loaded one, unpaired (not §5.2's overloaded partner): unsourced,
measured here (`SystemConfig.live_decode_partners` and `live_least_loaded`) on §6.1's three
workloads, everything else as `ttft_6_1` runs BlitzScale.

In: nothing (the workloads are `blitzscale_setup.WORKLOADS`). Out: per workload,
BlitzScale's mean TTFT and TBT, GPU-seconds and its live batches by the source's role;
the rows compare them with `ttft_6_1`'s S-LLM.
"""

import logging
from collections import Counter
from dataclasses import replace

from blitzscale_setup import WORKLOADS, logical_hosts, systems_6_1
from common import run
from monitor_bound import paper_slo
from tbt_measure import tbt

from surge.sim.settings import SimSettings
from surge.traces.resolve import load_trace
from surge.traces.transform import scale_rate, time_slice

log = logging.getLogger("blitzscale_eval")


def decode_partners_6_1(duration_s: float = 1200.0) -> dict:
    """§6.1's BlitzScale runs with `live_decode_partners` (the counterfactual above)."""
    out: dict = {"duration_s": duration_s, "workloads": {}}
    # surge before 2026-11-29: decode partners, and the least loaded one, unpaired
    cfg = replace(systems_6_1()["blitzscale"], live_decode_partners=True, live_least_loaded=True)
    for name, model, trace_name, scale, preset, per_host in WORKLOADS:
        trace = time_slice(scale_rate(load_trace(trace_name), scale), 0.0, duration_s)
        cluster = logical_hosts(preset, per_host)
        log.info("§6.1 %s blitzscale with decode instances as live partners", name)
        settings = SimSettings(cluster, (model,), cfg.name, slo=paper_slo(model))
        s, raw = run(trace, settings, cfg)
        roles = Counter(str(b.source_role) for b in raw.live_batches)
        out["workloads"][name] = {
            "ttft_mean_s": s["ttft_mean_s"],
            "gpu_seconds": s["gpu_seconds"],
            "tbt_mean_s": tbt(raw)["tbt_mean_s"],
            "live_batches_by_source_role": dict(roles),
        }
    return out
