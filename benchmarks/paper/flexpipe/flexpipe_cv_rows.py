"""REPORT.md rows of FlexPipe §9.1-§9.4 from `benchmarks/systems/flexpipe_cv.py`'s simulator
part (82 A100s, Gamma arrivals at 20 QPS, CV 1/2/4/8, 600 s, Llama-2 7B).

In: benchmarks/results/systems/flexpipe_cv.json (`sim.by_cv`: every variant per CV, and
`sim.hop_sensitivity`: the same at a 0.1-ms stage hop). Out: `rows.row` dicts for
`report.py`. Baselines as §9 deploys them: AlpaServe = the best static shape provisioned
once for the peak (`provisioned-N`, the shape of lowest p99: "configures pipelines based on
historical request patterns"), ServerlessLLM = load then serve (`load-then-serve`).
"""

from rows import row

PAPER = "FlexPipe"
PAPER_LATENCY = {"1": 0.383, "2": 0.469, "4": 0.661}
"""§9.1 Fig. 8: FlexPipe's total latency below AlpaServe's (CV 4: 66.1%; 80.6% vs MuxServe)."""


def _best_provisioned(v: dict) -> dict:
    return v[f"provisioned-{v['ratios']['best_provisioned_stages']}"]


def _efficiency(x: dict) -> float:
    """Goodput per GPU-second (§9.4 Fig. 12: goodput against GPU use)."""
    return x["goodput_rps"] / x["gpu_seconds"]


def report_rows(doc: dict) -> list[dict]:
    """Fig. 8 (latency) and Fig. 12 (resource efficiency); Fig. 10 (tail stability) is
    `flexpipe_figs.py`'s, beside its counterfactual."""
    by_cv, hop = doc["sim"]["by_cv"], doc["sim"]["hop_sensitivity"]
    red = {
        cv: 1 - by_cv[cv]["flexpipe"]["e2e_mean_s"] / _best_provisioned(by_cv[cv])["e2e_mean_s"]
        for cv in PAPER_LATENCY
    }
    red_hop = {
        cv: 1
        - hop["by_cv"][cv]["flexpipe"]["e2e_mean_s"]
        / _best_provisioned(hop["by_cv"][cv])["e2e_mean_s"]
        for cv in PAPER_LATENCY
    }
    c4 = by_cv["4"]
    eff_peak = _efficiency(c4["flexpipe"]) / _efficiency(_best_provisioned(c4))
    eff_sllm = _efficiency(c4["flexpipe"]) / _efficiency(c4["load-then-serve"])
    eff_auto = _efficiency(c4["flexpipe"]) / max(
        _efficiency(c4[f"static-{n}"]) for n in (1, 2, 4, 8)
    )
    held = c4["ratios"]["flexpipe_always_held_over_peak"]
    slo = min(c4[k]["slo_attainment"] for k in c4 if k != "ratios")

    def pct(d: dict) -> str:
        return " / ".join(f"{v:+.1%}" for v in d.values())

    return [
        row(
            PAPER,
            "Fig. 8",
            "end-to-end latency vs AlpaServe at CV 1 / 2 / 4: 38.3% / 46.9% / 66.1% lower",
            "38.3% / 46.9% / 66.1%",
            f"mean latency vs the best static shape provisioned for the peak: {pct(red)}",
            ordering=min(red.values()) > 0,
            pairs=tuple((red[cv], p) for cv, p in PAPER_LATENCY.items()),
            cause="The best static shape, provisioned for the peak (82 GPUs, 20 QPS), never "
            "queues, so FlexPipe's finer stages only add hops (1 ms per stage per step). "
            f"Counterfactual: a 0.1-ms (RDMA) hop: {pct(red)} -> {pct(red_hop)} (paper "
            "+38% / +47% / +66%: its statics queue, §9.1).",
        ),
        row(
            PAPER,
            "Fig. 12",
            "resource efficiency at CV 4: 8.5x better than Tetris (goodput per GPU use)",
            "8.5x",
            f"goodput per GPU-second at CV 4: {eff_peak:.2f}x the best static provisioned "
            f"for the peak, {eff_sllm:.2f}x ServerlessLLM, {eff_auto:.2f}x the best "
            f"autoscaled static shape; always held {held:.0%} of peak",
            ordering=eff_peak > 1,
            sim_value=eff_peak,
            paper_value=8.5,
            cause=f"Every baseline here keeps its goodput (SLO attainment >= {slo:.2f}), so "
            "the ratio is GPU-seconds alone; the paper's Tetris loses 87% of its goodput to "
            "GPU-multiplexing contention (1,543 of 12,000 rps), which the simulator does not "
            "model. Counterfactual (the baseline's provisioning, §9.1 'static approaches "
            f"provision for peak'): autoscaled static {eff_auto:.2f}x -> provisioned for the "
            f"peak {eff_peak:.2f}x.",
        ),
    ]
