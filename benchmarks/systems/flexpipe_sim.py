"""The simulator half of `benchmarks/systems/flexpipe_cv.py`: FlexPipe at the paper's scale (§9).

Variants of the same cluster, model and trace, in one run:
- `flexpipe`: the `flexpipe` system as it is (stage count from the arrivals' CV, refactored
  in flight, Eq. 4/2/6/10 via `sim/flexpipe.py`);
- `static-1`, `static-2`, `static-4`, `static-8`: the same system held at one granularity,
  one per stage count flexpipe can choose (`FlexPipeSettings().stage_counts`; a single
  stage count: never refactors). `static-fine` (`--fine-stages`) and `static-coarse`
  (`--coarse-stages`) name two of them, as the runtime half does;
- `load-then-serve`: the `serverlessllm` system (each instance loads the whole model, then
  serves);
- `provisioned-1`, `-2`, `-4`, `-8` (`run_all(provisioned=True)`): §9's static baselines,
  provisioned once: "static approaches typically provision GPU resources to match peak
  volumes" (§9.1; §9.4: "static approaches that provision for peak demand"). A fixed number
  of groups of one stage count, loaded before the first arrival (`PROVISION_LEAD_S` ahead;
  the lead is not counted) and held until the end: the autoscaler's `min_replicas` =
  `max_replicas` = that number, so it never scales. The number is the peak group count
  the same shape's autoscaled variant (`static-N`) reached on the same trace: the trace is
  its own history, the most generous sizing for the baseline (it is never short of
  groups at the trace's peak, and never holds more than it needed). Same router.
- `isocost-1`, `-2`, `-4`, `-8` (also `run_all(provisioned=True)`): the same fixed statics
  at flexpipe's cost instead of at the peak: ceil(flexpipe's GPU-seconds / (span x N))
  groups of N stages, so each holds at least flexpipe's GPU-seconds (an offline-configured
  system given flexpipe's budget, §9's AlpaServe: "configures pipelines based on historical
  request patterns" on a fixed set of GPUs). Provisioned-N answers "what does the same
  latency cost?", isocost-N "what latency does the same cost buy?".
Two workloads at the same mean rate: `gamma`, a Gamma renewal process of the given CV (the
issue's CV 1/2/4/8: stationary, every 15-s window has about the same CV), and `phased`,
`phase_s`-long phases alternating between CV 1 and the given CV (calm first): the CV
changes between windows, as in the paper's traces (§3.3 Fig. 1: the CV "exhibits
substantial fluctuation, with variation of up to 7x across different time windows"; §9
Fig. 9a: 15-s windows of the CV-8 trace range from 0.59 to 3.47).
Per variant and CV: p50/p99 end-to-end latency, p50/p99 TTFT (the simulator's queue time
plus prefill: it records no separate queue time), goodput (requests meeting the SLOs per
second), GPU-seconds (GPUs held x time), the GPUs always held (10th percentile of the GPU
count over time after the first minute) against the peak, refactorings by direction, and
where the GPU-seconds go (sampled every second: GPUs of loaded groups with no request, of
busy ones, and how full the busy ones are against their routing target).
Ratios per CV: `benchmarks/systems/flexpipe_ratios.py`.
"""

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from benchmarks.systems.flexpipe_ratios import STATIC_STAGES, ratios
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.systems import SystemConfig, system_config
from surge.sim.events import Priority
from surge.sim.metrics import gpus_over_time, summarize
from surge.sim.result import SimResult
from surge.sim.settings import SimSettings, Slo
from surge.sim.simulator import Simulation
from surge.traces.gamma import gamma_arrivals, gamma_trace
from surge.traces.request import Trace, make_trace

VARIANTS = ("flexpipe", "static-fine", "static-coarse", "load-then-serve")
"""The runtime half's variants (`flexpipe_cv.py`)."""
SIM_VARIANTS = ("flexpipe", *(f"static-{n}" for n in STATIC_STAGES), "load-then-serve")
"""The simulator half's variants."""
PROVISIONED_VARIANTS = tuple(f"provisioned-{n}" for n in STATIC_STAGES)
"""The statics provisioned once for the peak (`run_all(provisioned=True)`)."""
ISOCOST_VARIANTS = tuple(f"isocost-{n}" for n in STATIC_STAGES)
"""The statics fixed at flexpipe's GPU-seconds (`run_all(provisioned=True)`)."""
FIXED_PREFIXES = ("provisioned-", "isocost-")
"""Variants that hold a fixed group count from before the first arrival to the end."""
PROVISION_LEAD_S = 120.0
"""A provisioned variant's groups start loading this long before the first arrival (the
trace is shifted by it; its GPU-seconds count from the first arrival on)."""
WORKLOADS = ("gamma", "phased")
QUICK_RELEASE_S = 2.0
"""The scale-down FlexPipe shipped before it took §9.4's 5-minute reclamation and §9.1's
always-ready 30% (`policy.systems._FLEXPIPE_AUTOSCALE`): BlitzScale's 2 s, no floor."""


def quick_release(config: SystemConfig, floor: bool = False) -> SystemConfig:
    """`config` giving idle groups back after `QUICK_RELEASE_S` (a counterfactual, or a
    test of the release mechanism on a short trace); `floor` keeps its always-ready
    fraction, else none."""
    fast = replace(config.autoscale, downscale_delay_s=QUICK_RELEASE_S)
    if not floor:
        fast = replace(fast, always_ready_fraction=0.0)
    return replace(config, autoscale=fast)


def no_busy_merges(config: SystemConfig) -> SystemConfig:
    """`config` whose busy groups never merge (`FlexPipeSettings.merge_busy_groups` False):
    a counterfactual measuring what busy merges cost (docs/flexpipe.md)."""
    return replace(config, flexpipe=replace(config.flexpipe, merge_busy_groups=False))


def phased_trace(
    rate_rps: float,
    cv: float,
    duration_s: float,
    seed: int,
    phase_s: float,
    input_tokens: int,
    output_tokens: int,
) -> Trace:
    """Gamma arrivals at `rate_rps` in `phase_s`-long phases alternating between CV 1
    (calm, first) and CV `cv`; fixed token lengths."""
    rng = np.random.default_rng(seed)
    parts, start, k = [], 0.0, 0
    while start < duration_s:
        length = min(phase_s, duration_s - start)
        parts.append(start + gamma_arrivals(rng, rate_rps, 1.0 if k % 2 == 0 else cv, length))
        start, k = start + phase_s, k + 1
    arrival = np.concatenate(parts)
    n = len(arrival)
    ins = np.full(n, input_tokens, dtype=np.int64)
    outs = np.full(n, output_tokens, dtype=np.int64)
    return make_trace(f"phased-rate{rate_rps:g}-cv{cv:g}", arrival, ins, outs)


def _static_stages(variant: str, fine_stages: int, coarse_stages: int) -> int | None:
    """The stage count a static variant is held at; None for the others."""
    if variant == "static-fine":
        return fine_stages
    if variant == "static-coarse":
        return coarse_stages
    for prefix in ("static-", *FIXED_PREFIXES):
        if variant.startswith(prefix):
            return int(variant.removeprefix(prefix))
    return None


def run_one(
    variant: str,
    cv: float,
    *,
    cluster: str,
    model: str,
    rate_rps: float,
    duration_s: float,
    seed: int,
    slo: Slo,
    fine_stages: int,
    coarse_stages: int = 1,
    stage_hop_s: float | None = None,
    input_tokens: int,
    output_tokens: int,
    workload: str = "gamma",
    phase_s: float = 120.0,
    provisioned_groups: int | None = None,
    on_result: Callable[[SimResult], None] | None = None,
    change: Callable[[SystemConfig], SystemConfig] | None = None,
    max_batch: int | None = None,
    warm_instances: int = 0,
) -> dict:
    """One variant on one trace. A `provisioned-N` or `isocost-N` variant holds
    `provisioned_groups` groups of N stages from before the first arrival to the end (see
    the module). `on_result` gets the raw result (per-request times, FlexPipe Fig. 11);
    `change` alters the system last (a counterfactual). `max_batch` (None: the simulator's
    default) and `warm_instances` (serving at time 0) set the scenario as the emulated
    runtime's benchmark deploys it (`benchmarks/emulation/flexpipe.py`)."""
    if workload == "phased":
        trace = phased_trace(rate_rps, cv, duration_s, seed, phase_s, input_tokens, output_tokens)
    else:
        trace = gamma_trace(rate_rps, cv, duration_s, seed, input_tokens, output_tokens)
    system = "serverlessllm" if variant == "load-then-serve" else "flexpipe"
    settings = SimSettings(cluster, (model,), system, seed=seed, slo=slo)
    if max_batch is not None or warm_instances:
        settings = replace(
            settings, max_batch=max_batch or settings.max_batch, warm_instances=warm_instances
        )
    stages = _static_stages(variant, fine_stages, coarse_stages)
    config = system_config(system)
    if stages is not None:  # the system's one FlexPipe settings object, held at one shape
        config = replace(
            config, flexpipe=FlexPipeSettings(stage_counts=(stages,), cv_targets=(0.0,))
        )
    if stage_hop_s is not None:  # per-step activation hop between stages (sensitivity)
        config = replace(config, stage_hop_s=stage_hop_s)
    lead_s = 0.0
    if variant.startswith(FIXED_PREFIXES):
        if not provisioned_groups or provisioned_groups < 1:
            raise ValueError(f"{variant} needs provisioned_groups >= 1")
        lead_s = PROVISION_LEAD_S
        trace = replace(trace, arrival_s=trace.arrival_s + lead_s)
        fixed = replace(
            config.autoscale, min_replicas=provisioned_groups, max_replicas=provisioned_groups
        )
        config = replace(config, autoscale=fixed)
    if change is not None:
        config = change(config)
    sim = Simulation(trace, settings, config)
    if lead_s:  # one decision at time 0: min_replicas groups start loading
        for pool in sim.pools.values():
            sim.world.loop.schedule(
                0.0, Priority.CONTROL, 0, lambda p=pool: sim.scaler.autoscale(p)
            )
    held = _probe_groups(sim, lead_s)
    res = sim.run()
    if on_result is not None:
        on_result(res)
    s = summarize(res, settings)
    done = res.done_s >= 0
    e2e = res.done_s[done] - res.arrival_s[done]
    # Counted from the first arrival to the last request's end: a provisioned variant holds
    # its groups for good (the loop would run to its drain limit), and FlexPipe's groups
    # stay 5 idle minutes (§9.4) and its always-ready floor (§9.1) 15 (surge's
    # `forget_peak_after_idle_s`) after it.
    end_s = float(res.done_s.max()) if done.all() and len(done) else res.end_s
    _, gpus = gpus_over_time(res, 1.0)
    gpus = gpus[int(lead_s) : int(end_s) + 1]
    steady = gpus[60:] if len(gpus) > 120 else gpus
    span_s = (
        max(float(res.arrival_s.max() - res.arrival_s.min()), 1e-9) if len(res.arrival_s) else 1.0
    )
    ok = s["slo_attainment"] * s["requests"]
    return {
        "requests": s["requests"],
        "finished": s["finished"],
        "e2e_p50_s": float(np.percentile(e2e, 50)) if len(e2e) else None,
        "e2e_p99_s": float(np.percentile(e2e, 99)) if len(e2e) else None,
        "e2e_mean_s": float(e2e.mean()) if len(e2e) else None,
        "ttft_p50_s": s["ttft_p50_s"],
        "ttft_p99_s": s["ttft_p99_s"],
        "slo_attainment": s["slo_attainment"],
        "goodput_rps": ok / span_s,
        "gpu_seconds": gpu_seconds_between(res, lead_s, end_s),
        # how long a fixed variant on this trace is counted: first arrival to last end
        "first_arrival_to_last_end_s": float(res.done_s.max() - res.arrival_s.min())
        if done.all() and len(res.arrival_s)
        else None,
        "gpus_min": int(gpus.min()) if len(gpus) else 0,
        "gpus_peak": int(gpus.max()) if len(gpus) else 0,
        "gpus_always_held": float(np.percentile(steady, 10)) if len(steady) else 0.0,
        "refactors": dict(sim.flexpipe.num_refactors),
        "gpu_seconds_idle_groups": held["idle"],
        "gpu_seconds_busy_groups": held["busy"],
        "busy_group_fill": held["fill"] / held["busy"] if held["busy"] else None,
        "groups_seen": len(held["ids"]),
        "groups_loaded_at_first_arrival": held["loaded_at_start"],
        "wall_s": res.wall_s,
    }


def gpu_seconds_between(res, t0_s: float, t1_s: float) -> float:
    """GPU-seconds held in [`t0_s`, `t1_s`] (`gpu_seconds` is [0, end_s])."""
    total, last_t, last_n = 0.0, 0.0, 0
    for t, n in [*res.gpu_changes, (t1_s, None)]:
        a, b = max(last_t, t0_s), min(t, t1_s)
        total += last_n * max(b - a, 0.0)
        if t >= t1_s:
            break
        last_t, last_n = t, n
    return total


def _probe_groups(sim: Simulation, start_s: float = 0.0) -> dict:
    """Every second from `start_s` (the first arrival): GPUs held by serving groups with no
    request (`idle`) and with some (`busy`), and `fill`, busy GPUs weighted by outstanding /
    the group's routing target (the instance target of 8 where a system sets none): where
    GPU-seconds go; `ids`, every group seen, and `loaded_at_start`, the groups serving at
    the first probe."""
    acc: dict = {"idle": 0.0, "busy": 0.0, "fill": 0.0, "ids": set(), "loaded_at_start": None}
    pools = list(sim.pools.values())
    loop = sim.world.loop

    def probe() -> None:
        if acc["loaded_at_start"] is None:
            acc["loaded_at_start"] = sum(i.loaded for p in pools for i in p.instances)
        for pool in pools:
            for i in pool.instances:
                acc["ids"].add(i.id)
                if not i.loaded:
                    continue
                n = len(i.all_gpus)
                if i.outstanding == 0:
                    acc["idle"] += n
                else:
                    target = i.route_target or sim.system.autoscale.target_ongoing_requests
                    acc["busy"] += n
                    acc["fill"] += n * min(1.0, i.outstanding / target)
        if sim.router.unfinished:
            loop.schedule(loop.now_s + 1.0, Priority.SAMPLE, 2, probe)

    loop.schedule(start_s + 0.5, Priority.SAMPLE, 2, probe)
    return acc


def run_all(cvs: list[float], provisioned: bool = False, **kw) -> dict:
    """{cv: {variant: numbers}} for `SIM_VARIANTS` (and, if `provisioned`,
    `PROVISIONED_VARIANTS`, each sized by its `static-N`'s peak, and `ISOCOST_VARIANTS`,
    each at flexpipe's GPU-seconds) plus, per CV, flexpipe's `ratios`."""
    out: dict = {}
    for cv in cvs:
        row = {v: run_one(v, cv, **kw) for v in SIM_VARIANTS}
        if provisioned:
            for n in STATIC_STAGES:
                peak = -(-row[f"static-{n}"]["gpus_peak"] // n)
                row[f"provisioned-{n}"] = run_one(
                    f"provisioned-{n}", cv, provisioned_groups=max(1, peak), **kw
                )
            for n in STATIC_STAGES:
                row[f"isocost-{n}"] = run_one(
                    f"isocost-{n}", cv, provisioned_groups=isocost_groups(row, n, kw), **kw
                )
        row["ratios"] = ratios(row, kw["fine_stages"], kw.get("coarse_stages", 1))
        out[str(cv)] = row
    return out


def isocost_groups(row: dict, stages: int, kw: dict) -> int:
    """Groups of `stages` stages that, held over flexpipe's span (first arrival to its last
    request's end, as a fixed variant is counted), cost at least flexpipe's GPU-seconds."""
    fp = row["flexpipe"]
    span_s = fp["first_arrival_to_last_end_s"] or kw["duration_s"]
    return max(1, int(np.ceil(fp["gpu_seconds"] / (span_s * stages))))
