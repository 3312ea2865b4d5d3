"""REPORT.md rows of FlexPipe §9.1 Fig. 8 (latency vs AlpaServe) and §9.4 Fig. 12
(resource efficiency) from `flexpipe_shared.py`: §9's four models sharing 82 GPUs,
AlpaServe as one static split of the cluster among them.

In: benchmarks/results/paper/flexpipe_shared.json. Out: `rows.row` dicts for `report.py`.
"""

from rows import row

PAPER = "FlexPipe"
PAPER_LATENCY = {"1": 0.383, "2": 0.469, "4": 0.661}
"""§9.1 Fig. 8's headline per CV (CV 4: 66.1%; 80.6% vs MuxServe)."""
PAPER_VS_ALPASERVE = ("1", "4")
"""The CVs whose headline §9.1 states against AlpaServe ("38.3% lower overall latency than
AlpaServe and ServerlessLLM", "66.1% lower total latency than AlpaServe"); CV 2's is against
MuxServe ("46.9% lower latency than MuxServe"), which GPU-multiplexes and is not modelled,
so it is shown, not judged."""
PIPELINE = 4
"""AlpaServe's shape with one GPU per stage for every model (OPT-66B needs 4 stages)."""
LARGEST = "opt-66b"
"""The model whose per-request time decides the mean (see the cause)."""


def _goodput_text(fp: dict, alpa: dict) -> str:
    """Fig. 12's ratio split into its goodput and GPU-seconds factors, as the JSON has them."""
    kept = fp["goodput_rps"] / alpa["goodput_rps"]
    saved = alpa["gpu_seconds"] / fp["gpu_seconds"]
    head = (
        f"FlexPipe uses {saved:.2f}x fewer GPU-seconds (it keeps 30% of its peak groups "
        "and gives the rest back after 5 idle minutes, §9.1 / §9.4; AlpaServe holds its split) "
        f"at {kept:.1%} of AlpaServe's goodput ({fp['goodput_rps']:.1f} vs "
        f"{alpa['goodput_rps']:.1f} rps"
    )
    if abs(kept - 1) <= 0.02:
        return head + "): both keep their goodput, so the ratio is GPU-seconds alone"
    return head + f", SLO attainment {fp['slo_attainment']:.3f} vs {alpa['slo_attainment']:.3f})"


def _pct(d: dict) -> str:
    return " / ".join(f"{v:+.1%}" for v in d.values())


def report_rows(doc: dict) -> list[dict]:
    """Fig. 8 and Fig. 12 (Fig. 10, 11, 13, §9.6 are `flexpipe_figs_rows`')."""
    by_cv = doc["by_cv"]
    ratios = {cv: by_cv[cv]["ratios"] for cv in PAPER_LATENCY}
    red = {cv: r["latency_reduction_vs_alpaserve"] for cv, r in ratios.items()}
    slo = min(r["alpaserve_slo_attainment"] for r in ratios.values())
    shapes = " / ".join(str(r["alpaserve_stages"]) for r in ratios.values())
    c4 = ratios["4"]
    fp66, alpa66 = c4["mean_s"][LARGEST]
    others = {m: v for m, v in c4["latency_reduction_per_model"].items() if m != LARGEST}
    x2 = doc["rate_x2_cv4"]
    short = {cv: r["latency_reduction_vs_alpaserve"] for cv, r in doc["tokens_512_128"].items()}
    unsplit = {
        cv: r["latency_reduction_vs_alpaserve_unsplit"]
        for cv, r in ratios.items()
        if "latency_reduction_vs_alpaserve_unsplit" in r
    }
    # AlpaServe at its 4-stage shape: OPT-66B's groups FlexPipe-shaped, sized as FlexPipe's
    pp = {
        cv: 1
        - by_cv[cv]["flexpipe"]["e2e_mean_s"] / by_cv[cv][f"alpaserve-{PIPELINE}"]["e2e_mean_s"]
        for cv in PAPER_LATENCY
    }
    spread = {
        cv: 1
        - r["e2e_mean_s"] / by_cv[cv][f"alpaserve-{ratios[cv]['alpaserve_stages']}"]["e2e_mean_s"]
        for cv, r in doc.get("flexpipe_spread", {}).items()
    }
    spread66 = doc.get("flexpipe_spread", {}).get("4", {}).get("per_model", {}).get(LARGEST, {})

    def vs_alpa(key: str) -> dict:
        return {
            cv: 1
            - r["e2e_mean_s"]
            / by_cv[cv][f"alpaserve-{ratios[cv]['alpaserve_stages']}"]["e2e_mean_s"]
            for cv, r in doc.get(key, {}).items()
        }

    quick, quick_floor = vs_alpa("flexpipe_release_2s"), vs_alpa("flexpipe_release_2s_floor")
    quick_slo = min(
        (r["slo_attainment"] for r in doc.get("flexpipe_release_2s", {}).values()), default=1.0
    )
    reclaim_text = (
        "FlexPipe releasing idle groups after 2 s with no always-ready floor (as shipped "
        f"before §9.1 / §9.4's reclamation): {_pct(quick)} (its SLO attainment down to "
        f"{quick_slo:.3f}), after 2 s keeping the 30% floor: {_pct(quick_floor)}; "
        if quick and quick_floor
        else ""
    )
    alpa_best = {cv: by_cv[cv][f"alpaserve-{r['alpaserve_stages']}"] for cv, r in ratios.items()}
    alpa_groups = " / ".join(str(a["split"][LARGEST]) for a in alpa_best.values())
    alpa_stages = {a["per_model"][LARGEST]["gpus_per_group"] for a in alpa_best.values()}
    alpa_gpus = max(
        a["split"][LARGEST] * a["per_model"][LARGEST]["gpus_per_group"] for a in alpa_best.values()
    )
    fp_groups = " / ".join(
        str(by_cv[cv]["flexpipe"]["per_model"][LARGEST]["groups"]) for cv in ratios
    )
    hist = doc["history_cv1"]
    hist_text = " / ".join(
        f"CV {cv} {h['latency_reduction_vs_alpaserve']:+.1%} (SLO attainment "
        f"{h['alpaserve_slo_attainment']:.3f})"
        for cv, h in hist.items()
    )
    models = ", ".join(doc["models"].values())
    queue_free = (
        f"AlpaServe's split of the {doc['cluster_gpus']} GPUs (from each model's peak on the "
        f"trace, shapes {shapes} stages) meets the SLO for >= {slo:.3f} of requests at §9's "
        f"{doc['rate_rps']:g} QPS: it does not queue, so FlexPipe has no queue time to win "
        "(the paper's gain is queue time, 54.8-72.6% lower)."
    )
    static = by_cv["1"][f"static-{ratios['1']['alpaserve_stages']}"]
    queue_free += (
        f" The split is the cluster, not a peak: the autoscaled run it is sized on holds "
        f"{static['gpus_peak']} of the {doc['cluster_gpus']} GPUs already at CV 1 (OPT-66B "
        f"{static['per_model'][LARGEST]['groups']} groups), so no window for 'peak volume' "
        "(§9.1) changes it."
    )
    win = doc.get("windows_15s")
    if win:
        c8 = win["by_cv"]["8"]["cluster_cv_range"]
        lo, hi = win["paper_cv8_range"]
        queue_free += (
            " Our CV is Eq. 4's (std / mean of arrival intervals; a Gamma stream per model): "
            f"read in Fig. 9(a)'s {win['window_s']:g}-s windows our CV-8 trace measures "
            f"{c8[0]:.2f}-{c8[1]:.2f} against the paper's {lo:.2f}-{hi:.2f}, so its CV-8 "
            "trace is smoother within 15 s than ours (§9 does not say how its Azure Functions "
            "arrivals [58], not in shared/traces, were set to a CV); a reading of CV that "
            "made ours queue would have to make it burstier, not calmer."
        )
    return [
        row(
            PAPER,
            "Fig. 8",
            "end-to-end latency vs AlpaServe at CV 1 / 4: 38.3% / 66.1% lower (CV 2: 46.9% "
            "vs MuxServe, not modelled)",
            "38.3% / 66.1% (CV 2: 46.9% vs MuxServe)",
            f"mean latency vs AlpaServe, §9's four models ({models}) sharing "
            f"{doc['cluster_gpus']} GPUs at {doc['rate_rps']:g} QPS, Splitwise tokens, CV 1 / "
            f"2 / 4: {_pct(red)}",
            ordering=min(red.values()) > 0,
            reductions=tuple((red[cv], PAPER_LATENCY[cv]) for cv in PAPER_VS_ALPASERVE),
            cause=f"{queue_free} The difference is per-request time of the largest model: at "
            f"CV 4 OPT-66B averages {fp66:.1f} s in FlexPipe's groups against "
            f"{alpa66:.1f} s in AlpaServe's; the three smaller models {_pct(others)}. Both run "
            "OPT-66B as pipelines of one GPU per stage (no tensor parallelism: no 2-GPU "
            "server of §9's cluster holds it): AlpaServe's 1-stage shape cannot cut it, so "
            f"its groups fall back to {'/'.join(map(str, sorted(alpa_stages)))} one-GPU stages "
            "autoscaled at one instance's target (a FlexPipe pipeline's is its stage count "
            f"times that, `pipeline_autoscale`), and its split gives OPT-66B {alpa_groups} "
            f"groups (up to {alpa_gpus} of the {doc['cluster_gpus']} GPUs) at CV 1 / 2 / 4, "
            f"against FlexPipe's peak {fp_groups}, each filled up to its pipeline target "
            "(the `pack` router). Counterfactuals: AlpaServe at its "
            f"{PIPELINE}-stage shape (OPT-66B's groups sized as FlexPipe's): {_pct(pp)}; "
            f"FlexPipe spreading requests over its groups (least-loaded) instead of packing "
            f"them: {_pct(spread)} (OPT-66B at CV 4 {spread66.get('e2e_mean_s', 0):.1f} s; "
            "§5-§7 state no rule for sharing requests among a model's pipelines, §7 only "
            "'dynamic batching [13] to monitor request queue status', so neither is the "
            "paper's); "
            f"{reclaim_text}"
            f"twice §9's rate at CV 4 "
            f"{x2['latency_reduction_vs_alpaserve']:+.1%} (AlpaServe's SLO attainment "
            f"{x2['alpaserve_slo_attainment']:.3f}); 512 / 128-token requests {_pct(short)}; "
            f"AlpaServe at every model's peak, unsplit: {_pct(unsplit)}; AlpaServe's split "
            f"sized on the CV-1 trace (a calmer history): {hist_text}.",
        ),
        fig12_row(doc),
    ]


PAPER_EFFICIENCY_CV = "1"
"""§9.4 states Fig. 12's AlpaServe pair at CV 1: "FlexPipe achieves maximum goodput at 33% GPU
utilization—3× more efficient than AlpaServe with identical throughput"; its CV-4 headline,
"8.5× better resource efficiency", is against Tetris ("Tetris achieves only 1,543
requests/second despite 85% GPU utilization"), whose GPU multiplexing is not modelled."""
PAPER_EFFICIENCY = 3.0


def fig12_row(doc: dict) -> dict:
    """Fig. 12: goodput per GPU-second over AlpaServe's, judged at the CV §9.4 states it
    (CV 1, 3x); CV 2 and 4 shown."""
    by_cv = doc["by_cv"]
    effs = {cv: by_cv[cv]["ratios"]["efficiency_over_alpaserve"] for cv in PAPER_LATENCY}
    cv = PAPER_EFFICIENCY_CV
    fp = by_cv[cv]["flexpipe"]
    alpa = by_cv[cv][f"alpaserve-{by_cv[cv]['ratios']['alpaserve_stages']}"]
    per_gpu_s = alpa["goodput_rps"] / alpa["gpu_seconds"]
    quick = doc.get("flexpipe_release_2s", {}).get(cv)
    quick_eff = (
        f"{quick['goodput_rps'] / quick['gpu_seconds'] / per_gpu_s:.2f}x" if quick else "not run"
    )
    x2 = doc["rate_x2_cv4"]["efficiency_over_alpaserve"]
    return row(
        PAPER,
        "Fig. 12",
        "resource efficiency (goodput per GPU use) at CV 1: 3x AlpaServe's (CV 4: 8.5x "
        "Tetris's, not modelled)",
        "3x (CV 4: 8.5x vs Tetris)",
        "goodput per GPU-second over AlpaServe's static split, the four models sharing the "
        "cluster, CV 1 / 2 / 4: "
        + " / ".join(f"{e:.2f}x" for e in effs.values())
        + f" (CV 1: {fp['gpu_seconds']:.0f} vs {alpa['gpu_seconds']:.0f} GPU-s; SLO "
        f"attainment {fp['slo_attainment']:.3f} vs {alpa['slo_attainment']:.3f})",
        ordering=min(effs.values()) > 1,
        sim_value=effs[cv],
        paper_value=PAPER_EFFICIENCY,
        cause=f"At CV 1 {_goodput_text(fp, alpa)}. The paper's AlpaServe runs at about 3x "
        "FlexPipe's 33% GPU utilization with the same goodput; ours holds the split that "
        "its autoscaled run peaks at (the cluster, see Fig. 8) against FlexPipe's 30% floor "
        "and 5-minute window. Before this reading the row compared CV 4 against the paper's "
        f"Tetris pair (8.5x): {effs['4']:.2f}x; Tetris loses 87% of its goodput to GPU-"
        "multiplexing contention (1,543 of 12,000 rps), which the simulator does not model. "
        f"Counterfactuals: twice §9's rate at CV 4 {x2:.2f}x; FlexPipe releasing idle "
        f"groups after 2 s with no floor (as shipped before), CV 1: {quick_eff}.",
    )
