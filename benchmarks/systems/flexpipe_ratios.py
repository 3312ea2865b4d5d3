"""flexpipe against the static shapes of one CV's row of `benchmarks/systems/flexpipe_sim.py`.

In: one CV's row, {variant: numbers} (`flexpipe_sim.run_one`'s). Out: flexpipe's ratios.
Ratios per CV (`ratios`): against the best provisioned shape (lowest p99) and the
provisioned coarse shape, where run; against the best static shape of the run (lowest p99 over every
static stage count: an oracle that picks the shape for each CV), against static-coarse (one
shape for every CV, as the paper's offline-configured baselines, §3.3 / §9), and the
earlier runs' ratio (best of static-fine and static-coarse only).
"""

from surge.policy.flexpipe.settings import FlexPipeSettings

STATIC_STAGES = FlexPipeSettings().stage_counts
"""One static variant per stage count flexpipe chooses among."""


def ratios(row: dict, fine_stages: int, coarse_stages: int) -> dict:
    """flexpipe against the static shapes of one CV's `row` ({variant: numbers})."""
    statics = {n: row[f"static-{n}"] for n in STATIC_STAGES}
    best_n = min(statics, key=lambda n: (statics[n]["e2e_p99_s"], statics[n]["gpu_seconds"]))
    best, coarse, fp = statics[best_n], statics[coarse_stages], row["flexpipe"]
    two = [statics[fine_stages], coarse]
    return {
        "best_static_stages": best_n,
        "best_static_over_flexpipe_e2e_p99": best["e2e_p99_s"] / fp["e2e_p99_s"],
        "best_static_over_flexpipe_e2e_p50": best["e2e_p50_s"] / fp["e2e_p50_s"],
        **dominance(row),
        "flexpipe_over_best_static_gpu_seconds": fp["gpu_seconds"] / best["gpu_seconds"],
        "coarse_over_flexpipe_e2e_p99": coarse["e2e_p99_s"] / fp["e2e_p99_s"],
        "flexpipe_over_coarse_gpu_seconds": fp["gpu_seconds"] / coarse["gpu_seconds"],
        "fine_coarse_best_over_flexpipe_e2e_p99": min(r["e2e_p99_s"] for r in two)
        / fp["e2e_p99_s"],
        "flexpipe_over_fine_coarse_best_gpu_seconds": fp["gpu_seconds"]
        / min(r["gpu_seconds"] for r in two),
        "flexpipe_always_held_over_peak": fp["gpus_always_held"] / max(fp["gpus_peak"], 1),
        **provisioned_ratios(row, coarse_stages),
        **isocost_ratios(row),
    }


def dominance(row: dict) -> dict:
    """flexpipe against every static shape of `row` on both the median and the tail (no
    single shape is best on both once the CV is high: one stage has the lowest median,
    finer ones the lowest tail). Per shape N, `N.p50 / fp.p50` and `N.p99 / fp.p99` (> 1:
    flexpipe better). `advantage_over_every_static`: the least over shapes of the better
    of the two, i.e. flexpipe beats every static shape by at least this on one of them;
    `worst_over_statics`: the least of all of them, i.e. it is nowhere worse than this
    (1: never worse). `mean_over_best_static_mean`: the lowest mean latency of a static
    shape over flexpipe's (§9 Fig. 8's measure)."""
    fp = row["flexpipe"]
    per = {
        n: (row[f"static-{n}"]["e2e_p50_s"] / fp["e2e_p50_s"],
            row[f"static-{n}"]["e2e_p99_s"] / fp["e2e_p99_s"])
        for n in STATIC_STAGES
    }  # fmt: skip
    out = {
        "advantage_over_every_static": min(max(p) for p in per.values()),
        "worst_over_statics": min(min(p) for p in per.values()),
    }
    if fp.get("e2e_mean_s"):
        best_mean = min(row[f"static-{n}"]["e2e_mean_s"] for n in STATIC_STAGES)
        out["mean_over_best_static_mean"] = best_mean / fp["e2e_mean_s"]
    return out


def provisioned_ratios(row: dict, coarse_stages: int) -> dict:
    """flexpipe against the provisioned statics of `row`, where run: the one with the
    lowest p99 and the coarse one (one shape for every CV)."""
    prov = {n: row[f"provisioned-{n}"] for n in STATIC_STAGES if f"provisioned-{n}" in row}
    if not prov:
        return {}
    fp = row["flexpipe"]
    best_n = min(prov, key=lambda n: (prov[n]["e2e_p99_s"], prov[n]["gpu_seconds"]))
    out = {
        "best_provisioned_stages": best_n,
        "best_provisioned_groups": prov[best_n]["gpus_peak"] // best_n,
        "best_provisioned_over_flexpipe_e2e_p99": prov[best_n]["e2e_p99_s"] / fp["e2e_p99_s"],
        "flexpipe_over_best_provisioned_gpu_seconds": fp["gpu_seconds"]
        / prov[best_n]["gpu_seconds"],
    }
    if coarse_stages in prov:
        c = prov[coarse_stages]
        out["provisioned_coarse_over_flexpipe_e2e_p99"] = c["e2e_p99_s"] / fp["e2e_p99_s"]
        out["flexpipe_over_provisioned_coarse_gpu_seconds"] = fp["gpu_seconds"] / c["gpu_seconds"]
    return out


def isocost_ratios(row: dict) -> dict:
    """flexpipe against the statics fixed at its cost (`isocost-N`), where run: the one
    with the lowest p99 (the best shape an offline configuration could pick with hindsight)."""
    fixed = {n: row[f"isocost-{n}"] for n in STATIC_STAGES if f"isocost-{n}" in row}
    if not fixed:
        return {}
    fp = row["flexpipe"]
    best_n = min(fixed, key=lambda n: (fixed[n]["e2e_p99_s"], fixed[n]["gpu_seconds"]))
    best = fixed[best_n]
    return {
        "best_isocost_stages": best_n,
        "best_isocost_groups": best["gpus_peak"] // best_n,
        "best_isocost_over_flexpipe_e2e_p99": best["e2e_p99_s"] / fp["e2e_p99_s"],
        "best_isocost_over_flexpipe_e2e_p50": best["e2e_p50_s"] / fp["e2e_p50_s"],
        "flexpipe_over_best_isocost_gpu_seconds": fp["gpu_seconds"] / best["gpu_seconds"],
        "flexpipe_over_best_isocost_slo_attainment": fp["slo_attainment"]
        / max(best["slo_attainment"], 1e-9),
    }
