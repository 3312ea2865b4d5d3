"""The simulator half of `benchmarks/flexpipe_cv.py`: FlexPipe at the paper's scale (§9).

Four variants of the same cluster, model and Gamma trace, in one run:
- `flexpipe`: the `flexpipe` system as it is (stage count from the arrivals' CV, refactored
  in flight, Eq. 4/2/6/10 via `sim/flexpipe.py`);
- `static-fine`: the same system with one granularity, `--fine-stages` stages per instance
  (FlexPipeSettings with a single stage count: never refactors);
- `static-coarse`: the same system with one stage per instance;
- `load-then-serve`: the `serverlessllm` system (each instance loads the whole model, then
  serves).
Per variant and CV: p50/p99 end-to-end latency, p50/p99 TTFT (the simulator's queue time
plus prefill: it records no separate queue time), goodput (requests meeting the SLOs per
second), GPU-seconds (GPUs held x time), the GPUs always held (10th percentile of the GPU
count over time after the first minute) against the peak, refactorings by direction, and
where the GPU-seconds go (sampled every second: GPUs of loaded groups with no request, of
busy ones, and how full the busy ones are against their routing target).
"""

from dataclasses import replace

import numpy as np

from surge.policy.flexpipe_system import FlexPipeSettings
from surge.policy.systems import system_config
from surge.sim.events import Priority
from surge.sim.metrics import gpu_seconds, gpus_over_time, summarize
from surge.sim.settings import SimSettings, Slo
from surge.sim.simulator import Simulation
from surge.traces.gamma import gamma_trace

VARIANTS = ("flexpipe", "static-fine", "static-coarse", "load-then-serve")


def _settings(variant: str, fine_stages: int, coarse_stages: int) -> FlexPipeSettings | None:
    if variant == "static-fine":
        return FlexPipeSettings(stage_counts=(fine_stages,), cv_targets=(0.0,))
    if variant == "static-coarse":
        return FlexPipeSettings(stage_counts=(coarse_stages,), cv_targets=(0.0,))
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
) -> dict:
    trace = gamma_trace(rate_rps, cv, duration_s, seed, input_tokens, output_tokens)
    system = "serverlessllm" if variant == "load-then-serve" else "flexpipe"
    settings = SimSettings(cluster, (model,), system, seed=seed, slo=slo)
    fp = _settings(variant, fine_stages, coarse_stages)
    config = system_config(system)
    if fp is not None:  # the system's one FlexPipe settings object, held at one shape
        config = replace(config, flexpipe=fp)
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
    """{cv: {variant: numbers}} plus, per CV, flexpipe's ratios to the best static shape."""
    out: dict = {}
    for cv in cvs:
        row = {v: run_one(v, cv, **kw) for v in VARIANTS}
        statics = [row["static-fine"], row["static-coarse"]]
        best_p99 = min(r["e2e_p99_s"] for r in statics if r["e2e_p99_s"] is not None)
        best_gpu = min(r["gpu_seconds"] for r in statics)
        fp = row["flexpipe"]
        row["ratios"] = {
            "best_static_over_flexpipe_e2e_p99": best_p99 / fp["e2e_p99_s"],
            "flexpipe_over_best_static_gpu_seconds": fp["gpu_seconds"] / best_gpu,
            "flexpipe_always_held_over_peak": fp["gpus_always_held"] / max(fp["gpus_peak"], 1),
        }
        out[str(cv)] = row
    return out
