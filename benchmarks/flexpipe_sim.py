"""The simulator half of `benchmarks/flexpipe_cv.py`: FlexPipe at the paper's scale (§9).

Variants of the same cluster, model and trace, in one run:
- `flexpipe`: the `flexpipe` system as it is (stage count from the arrivals' CV, refactored
  in flight, Eq. 4/2/6/10 via `sim/flexpipe.py`);
- `static-1`, `static-2`, `static-4`, `static-8`: the same system held at one granularity,
  one per stage count flexpipe can choose (`FlexPipeSettings().stage_counts`; a single
  stage count: never refactors). `static-fine` (`--fine-stages`) and `static-coarse`
  (`--coarse-stages`) name two of them, as the runtime half does;
- `load-then-serve`: the `serverlessllm` system (each instance loads the whole model, then
  serves).
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
Ratios per CV (`ratios`): against the best static shape of the run (lowest p99 over every
static stage count: an oracle that picks the shape for each CV), against static-coarse (one
shape for every CV, as the paper's offline-configured baselines, §3.3 / §9), and the
earlier runs' ratio (best of static-fine and static-coarse only).
"""

from dataclasses import replace

import numpy as np

from surge.policy.flexpipe_system import FlexPipeSettings
from surge.policy.systems import system_config
from surge.sim.events import Priority
from surge.sim.metrics import gpu_seconds, gpus_over_time, summarize
from surge.sim.settings import SimSettings, Slo
from surge.sim.simulator import Simulation
from surge.traces.gamma import gamma_arrivals, gamma_trace
from surge.traces.request import Trace, make_trace

VARIANTS = ("flexpipe", "static-fine", "static-coarse", "load-then-serve")
"""The runtime half's variants (`flexpipe_cv.py`)."""
STATIC_STAGES = FlexPipeSettings().stage_counts
"""One static variant per stage count flexpipe chooses among."""
SIM_VARIANTS = ("flexpipe", *(f"static-{n}" for n in STATIC_STAGES), "load-then-serve")
"""The simulator half's variants."""
WORKLOADS = ("gamma", "phased")


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
    if variant.startswith("static-"):
        return int(variant.removeprefix("static-"))
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
) -> dict:
    if workload == "phased":
        trace = phased_trace(rate_rps, cv, duration_s, seed, phase_s, input_tokens, output_tokens)
    else:
        trace = gamma_trace(rate_rps, cv, duration_s, seed, input_tokens, output_tokens)
    system = "serverlessllm" if variant == "load-then-serve" else "flexpipe"
    settings = SimSettings(cluster, (model,), system, seed=seed, slo=slo)
    stages = _static_stages(variant, fine_stages, coarse_stages)
    config = system_config(system)
    if stages is not None:  # the system's one FlexPipe settings object, held at one shape
        config = replace(
            config, flexpipe=FlexPipeSettings(stage_counts=(stages,), cv_targets=(0.0,))
        )
    if stage_hop_s is not None:  # per-step activation hop between stages (sensitivity)
        config = replace(config, stage_hop_s=stage_hop_s)
    sim = Simulation(trace, settings, config)
    held = _probe_groups(sim)
    res = sim.run()
    s = summarize(res, settings)
    done = res.done_s >= 0
    e2e = res.done_s[done] - res.arrival_s[done]
    _, gpus = gpus_over_time(res, 1.0)
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
        "ttft_p50_s": s["ttft_p50_s"],
        "ttft_p99_s": s["ttft_p99_s"],
        "slo_attainment": s["slo_attainment"],
        "goodput_rps": ok / span_s,
        "gpu_seconds": gpu_seconds(res),
        "gpus_peak": int(gpus.max()) if len(gpus) else 0,
        "gpus_always_held": float(np.percentile(steady, 10)) if len(steady) else 0.0,
        "refactors": dict(sim.flexpipe.num_refactors),
        "gpu_seconds_idle_groups": held["idle"],
        "gpu_seconds_busy_groups": held["busy"],
        "busy_group_fill": held["fill"] / held["busy"] if held["busy"] else None,
        "wall_s": res.wall_s,
    }


def _probe_groups(sim: Simulation) -> dict[str, float]:
    """Every second: GPUs held by serving groups with no request (`idle`) and with some
    (`busy`), and `fill`, busy GPUs weighted by outstanding / the group's routing target
    (the instance target of 8 where a system sets none): where GPU-seconds go."""
    acc = {"idle": 0.0, "busy": 0.0, "fill": 0.0}
    pools = list(sim.pools.values())
    loop = sim.world.loop

    def probe() -> None:
        for pool in pools:
            for i in pool.instances:
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

    loop.schedule(0.5, Priority.SAMPLE, 2, probe)
    return acc


def run_all(cvs: list[float], **kw) -> dict:
    """{cv: {variant: numbers}} for `SIM_VARIANTS` plus, per CV, flexpipe's `ratios`."""
    out: dict = {}
    for cv in cvs:
        row = {v: run_one(v, cv, **kw) for v in SIM_VARIANTS}
        row["ratios"] = ratios(row, kw["fine_stages"], kw.get("coarse_stages", 1))
        out[str(cv)] = row
    return out


def ratios(row: dict, fine_stages: int, coarse_stages: int) -> dict:
    """flexpipe against the static shapes of one CV's `row` ({variant: numbers})."""
    statics = {n: row[f"static-{n}"] for n in STATIC_STAGES}
    best_n = min(statics, key=lambda n: (statics[n]["e2e_p99_s"], statics[n]["gpu_seconds"]))
    best, coarse, fp = statics[best_n], statics[coarse_stages], row["flexpipe"]
    two = [statics[fine_stages], coarse]
    return {
        "best_static_stages": best_n,
        "best_static_over_flexpipe_e2e_p99": best["e2e_p99_s"] / fp["e2e_p99_s"],
        "flexpipe_over_best_static_gpu_seconds": fp["gpu_seconds"] / best["gpu_seconds"],
        "coarse_over_flexpipe_e2e_p99": coarse["e2e_p99_s"] / fp["e2e_p99_s"],
        "flexpipe_over_coarse_gpu_seconds": fp["gpu_seconds"] / coarse["gpu_seconds"],
        "fine_coarse_best_over_flexpipe_e2e_p99": min(r["e2e_p99_s"] for r in two)
        / fp["e2e_p99_s"],
        "flexpipe_over_fine_coarse_best_gpu_seconds": fp["gpu_seconds"]
        / min(r["gpu_seconds"] for r in two),
        "flexpipe_always_held_over_peak": fp["gpus_always_held"] / max(fp["gpus_peak"], 1),
    }
