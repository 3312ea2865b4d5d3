"""BlitzScale's load-monitor bound profiled as §5.3 says, for the reproductions'
counterfactuals (Fig. 15, §6.1's 7B row, §6.2's GPU time).

In: a model, the cluster it runs on, the trace it serves, a system's config. Out: the
requests in flight one instance may carry (`profiled_bound`) and the config with that bound
(`with_bound`). §5.3: the monitor's upper bound "can be derived by profiling the average
serving load per-instance offline"; the paper gives no number, and surge's shipped bound
(`policy/systems._AUTOSCALE`, 8 in flight) is every system's and unsourced.
"""

from dataclasses import replace

import numpy as np

from surge.sim.costs import cost_model
from surge.sim.models import load_model

TTFT_SLO_7B_S = 0.45
"""§3: "450ms and 150ms [TTFT and TBT SLO] for Llama2-7B model"."""


def profiled_bound(model: str, cluster, trace) -> float:
    """The requests of the trace's mix one instance prefills within §3's 7B TTFT SLO: the
    SLO over the cost model's mean prefill time of the trace's prompts (the queue an
    instance may hold and still meet the SLO)."""
    costs = cost_model(load_model(model), cluster.groups[0].gpu)
    mean_prefill_s = float(np.mean([costs.prefill_s(int(n)) for n in trace.input_tokens]))
    return TTFT_SLO_7B_S / mean_prefill_s


def with_bound(cfg, bound: float):
    """`cfg` with its monitor's per-instance bound set to `bound` requests in flight."""
    return replace(cfg, autoscale=replace(cfg.autoscale, target_ongoing_requests=bound))
