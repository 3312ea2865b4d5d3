"""REPORT.md rows of flexpipe_figs.py's JSON: Fig. 10 (tail stability), Fig. 11 (stall
recovery), Fig. 13 (production trace) and §9.6, each miss with the counterfactuals that
script measured.

In: benchmarks/results/paper/flexpipe_figs.json. Out: `rows.row` dicts for `report.py`.
"""

from rows import row

PAPER = "FlexPipe"


def report_rows(doc: dict) -> list[dict]:
    """REPORT.md rows (`report.py`)."""
    f11, f13, f96 = doc["fig11"], doc["fig13"], doc["init"]
    c4 = f11["by_cv"]["4"]
    med = {k: v["recovery_median_s"] * 1e3 for k, v in c4.items()}
    quick = f11.get("counterfactual_flexpipe_release_2s", {})
    quick4 = quick.get("4")
    speedup = med["serverlessllm"] / max(med["flexpipe"], 1e-9)
    always = c4["flexpipe"].get("always_held_over_peak")
    return [
        fig10_row(f11),
        row(
            PAPER,
            "Fig. 11",
            "stall recovery at CV 4: FlexPipe 9 ms, 44% faster than AlpaServe (16 ms), 82% "
            "than ServerlessLLM (50 ms)",
            "9 / 16 / 50 ms",
            "median recovery at CV 4 (stalls): "
            + ", ".join(
                f"{k} {v['recovery_median_s'] * 1e3:.0f} ms ({v['stalls']})"
                if v["stalls"]
                else f"{k} no stall"
                for k, v in c4.items()
            )
            + f"; ServerlessLLM / FlexPipe {speedup:.1f}x",
            ordering=c4["alpaserve"]["stalls"] > 0
            and med["flexpipe"] < min(med["alpaserve"], med["serverlessllm"]),
            sim_value=speedup,
            paper_value=50 / 9,
            cause="AlpaServe as §9 deploys it holds the trace's peak capacity throughout and "
            "never stalls; FlexPipe keeps 30% of its peak groups ready (§9.1) and gives the "
            "rest back after 5 idle minutes (§9.4): it stalls while a burst beyond what it "
            "holds waits for new groups to load; ServerlessLLM stalls rarely but for seconds "
            "(SSD loads). Counterfactual: FlexPipe releasing idle groups after 2 s with no "
            "floor (as shipped before): "
            + (
                f"stalls {c4['flexpipe']['stalls']} -> {quick4['stalls']}, median "
                f"{med['flexpipe']:.0f} -> {quick4['recovery_median_s'] * 1e3:.0f} ms"
                if quick4
                else "not run"
            )
            + " (paper: 9 ms; its stalls are stage imbalances a refactor fixes, §9.3).",
        ),
        fig13_row(f13, doc.get("fig13_alpaserve")),
        row(
            PAPER,
            "§9.6",
            "production case study: instance initialisation 72% lower; always-on reservation "
            "30% of peak (static 75%)",
            "72%; 30%",
            f"cold-start initialisation {f96['mean_reduction']:.0%} lower ({INIT_STAGES}-stage "
            "group, §9's fine pipeline, vs whole model, 7B/8B/13B); always ready: 30% of the "
            "peak groups (§9.1, the system's floor); GPUs held 90% of the time over §9.1's "
            "2 hours at CV 4: "
            + (f"{always:.0%} of peak" if always is not None else "not run")
            + " (the 5-minute window, §9.4, holds more between bursts)",
            ordering=f96["mean_reduction"] > 0,
            reductions=((f96["mean_reduction"], PAPER_INIT_REDUCTION),),
            cause=init_cause(f96),
        ),
    ]


PAPER_P99_GROWTH = (2.0, 3.0)
"""§9.2: "This advantage becomes more pronounced as CV increases from 1 to 4, with FlexPipe
maintaining well-controlled P99 latency while competitors experience 2-3× degradation":
each competitor's own P99 at CV 4 over its P99 at CV 1 (ServerlessLLM here; Tetris is
not modelled), not its P99 over FlexPipe's at one CV."""


def _xs(d: dict) -> str:
    return " / ".join(f"{v:.2f}x" for v in d.values())


def _growth(by_cv: dict, system: str) -> float:
    """`system`'s P99 at the last CV (4) over its P99 at the first (1)."""
    p99 = [v[system]["e2e_p99_s"] for v in by_cv.values()]
    return p99[-1] / p99[0]


def _short_text(short: dict) -> str:
    """The 600-s counterfactual (ServerlessLLM under its older name `load-then-serve`):
    its P99 growth from CV 1 to CV 4 and its P99 over FlexPipe's per CV."""
    if not short:
        return "not run"
    over = {
        cv: v["load-then-serve"]["e2e_p99_s"] / v["flexpipe"]["e2e_p99_s"]
        for cv, v in short.items()
    }
    return (
        f"S-LLM's P99 growth {_growth(short, 'load-then-serve'):.2f}x "
        f"(S-LLM / FlexPipe {_xs(over)})"
    )


def fig10_row(f11: dict) -> dict:
    """Fig. 10: judged on ServerlessLLM's own P99 degradation from CV 1 to CV 4 against the
    paper's 2-3x (`PAPER_P99_GROWTH`); the ordering: its P99 above FlexPipe's at every CV
    (§9.2: "FlexPipe maintains consistently lower latency across all percentiles") and
    degrading more than FlexPipe's."""
    by_cv = f11["by_cv"]
    tail = {
        cv: v["serverlessllm"]["e2e_p99_s"] / v["flexpipe"]["e2e_p99_s"] for cv, v in by_cv.items()
    }
    growth = {k: _growth(by_cv, k) for k in ("serverlessllm", "flexpipe")}
    p99 = {k: [by_cv[cv][k]["e2e_p99_s"] for cv in by_cv] for k in ("flexpipe", "serverlessllm")}
    gpus = {k: [by_cv[cv][k]["gpus_peak"] for cv in by_cv] for k in ("flexpipe", "serverlessllm")}
    short = _short_text(f11.get("counterfactual_600s", {}))
    spread = f11.get("counterfactual_flexpipe_least_loaded", {})
    cvs = " / ".join(by_cv)
    return row(
        PAPER,
        "Fig. 10",
        "tail stability: competitors' P99 degrades 2-3x from CV 1 to CV 4 while FlexPipe's "
        "stays controlled and below theirs",
        "2-3x",
        f"P99 at CV 4 over CV 1: ServerlessLLM {growth['serverlessllm']:.2f}x, FlexPipe "
        f"{growth['flexpipe']:.2f}x; P99 ServerlessLLM / FlexPipe at CV {cvs}: {_xs(tail)}",
        ordering=min(tail.values()) > 1 and growth["serverlessllm"] > growth["flexpipe"],
        sim_value=growth["serverlessllm"],
        paper_range=PAPER_P99_GROWTH,
        cause="Over §9.1's 2 hours ServerlessLLM's LRU host cache is warm: it loads "
        "from host memory and scales out wider (peak GPUs "
        f"{'/'.join(str(g) for g in gpus['serverlessllm'])} vs FlexPipe's "
        f"{'/'.join(str(g) for g in gpus['flexpipe'])}), so its p99 "
        f"({'/'.join(f'{v:.2f}' for v in p99['serverlessllm'])} s) barely grows with the CV "
        f"and stays below FlexPipe's ({'/'.join(f'{v:.2f}' for v in p99['flexpipe'])} s), "
        "whose requests are packed on fewer GPUs. Judged since 2026-11-29 on the competitor's own "
        "degradation, as §9.2 words it ('FlexPipe maintaining well-controlled P99 latency "
        "while competitors experience 2-3× degradation' as 'CV increases from 1 to 4'); "
        f"before, on S-LLM / FlexPipe P99 at each CV ({_xs(tail)}) against the 2-3x: a miss "
        "either way. Counterfactuals: 600 s instead of 2 h (S-LLM's first SSD loads then its "
        f"tail): {short}; FlexPipe spreading requests (least-loaded) instead of packing "
        "them: its p99 "
        + ("/".join(f"{v['e2e_p99_s']:.2f}" for v in spread.values()) or "not run")
        + " s.",
    )


PAPER_INIT_REDUCTION = 0.72
"""§9.6: "instance initialization latency was reduced by 72% on average across all model
sizes" (a production rollout against "the static baseline")."""
INIT_STAGES = 4
"""The FlexPipe group §9.6's row times (`init_latency`: §9's fine pipeline, `fine_stages`;
FlexPipe's finest granularity, 8 stages, is a counterfactual beside it)."""
INIT_START_S = 0.1
"""FlexPipe's engine start (`init_s`), carried by both sides of `init_latency`."""


def init_cause(f96: dict) -> str:
    """Why §9.6's ratio (FlexPipe / whole-model initialisation, 1 - X) is off: arithmetic on
    the JSON's times (no run): the ceiling of INIT_STAGES parallel loads and the same times
    without the engine start both sides carry."""
    models = f96["models"]
    red = {m: v["reduction"] for m, v in models.items()}
    bare = {
        m: 1 - (v["flexpipe"] - INIT_START_S) / (v["serverlessllm"] - INIT_START_S)
        for m, v in models.items()
    }
    quarters = {
        m: (v["flexpipe"] - INIT_START_S) / ((v["serverlessllm"] - INIT_START_S) / INIT_STAGES)
        for m, v in models.items()
    }
    mean_bare = sum(bare.values()) / len(bare)
    paper_ratio = 1 - PAPER_INIT_REDUCTION

    def pcts(d: dict) -> str:
        return " / ".join(f"{v:.0%}" for v in d.values())

    return (
        f"Judged on the ratio FlexPipe / whole-model initialisation (1 - X): "
        f"{1 - f96['mean_reduction']:.2f} vs the paper's {paper_ratio:.2f}. "
        f"{INIT_STAGES} stages each load 1/{INIT_STAGES} in parallel (§7), so the reduction "
        f"cannot pass {1 - 1 / INIT_STAGES:.0%} (ratio {1 / INIT_STAGES:.2f}); per model "
        f"({' / '.join(models)}) it is {pcts(red)}. Both sides carry FlexPipe's "
        f"{INIT_START_S:g}-s engine start (unsourced); arithmetic on these times (not a run): "
        f"without it {pcts(bare)} (mean {mean_bare:.0%}, ratio {1 - mean_bare:.2f}, "
        f"{(1 - mean_bare) / paper_ratio - 1:+.0%}), the {INIT_STAGES}-stage load taking "
        + " / ".join(f"{q:.2f}" for q in quarters.values())
        + f"x 1/{INIT_STAGES} of the whole model's. The paper's 72% averages a production "
        "rollout's models against a static baseline it does not describe (§9.6)."
        + _granularity_text(f96)
    )


def _granularity_text(f96: dict) -> str:
    """What the verdict rests on: the granularity the row's group has (§9.6 does not say
    at which one its production instances start; Eq. 11 picks it from the CV and the
    queue), measured at FlexPipe's finest and at what its own scale-outs choose."""
    finest, stages = f96.get("counterfactual_finest"), f96.get("scale_out_stages_production")
    if not finest or not stages:
        return ""
    paper_ratio = 1 - PAPER_INIT_REDUCTION
    ratio = 1 - finest["mean_reduction"]
    within = abs(ratio / paper_ratio - 1) <= 0.2
    verdict = "the row would hold" if within else "the row would still miss"

    def starts(counts: dict) -> str:
        return " + ".join(f"{n} x {s}-stage" for s, n in counts.items())

    return (
        " The verdict rests on the group's granularity, which §9.6 does not state (§7 "
        "Eq. 11 picks a scale-out's from the CV times the queue): at FlexPipe's finest "
        f"({finest['stages']} stages) {finest['mean_reduction']:.0%} (ratio {ratio:.2f}, "
        f"{ratio / paper_ratio - 1:+.0%}). Neither group is what its own scale-outs start "
        "at here: on Fig. 13's production trace they start as "
        + "; ".join(f"{m} {starts(c)}" for m, c in stages.items())
        + " (a 1-stage start initialises as the whole model does), so the 72% is read on "
        f"a group of a fixed granularity; at the finest {verdict}."
    )


FIG13_PAPER = {
    "llama3-8b": ("WHISPER-9B", "AlpaServe", 0.0643),
    "llama2-7b": ("LLAMA2-7B", "ServerlessLLM", 0.1952),
    "llama2-13b": ("BERT-21B", "ServerlessLLM", 0.1897),
    "opt-66b": ("OPT-66B", "AlpaServe", 0.2438),
}
"""§9.5's four gains, each against the system the text names for that model (stand-in
profile -> paper model, comparator, gain); their mean is the 17.32%."""


def fig13_row(f13: dict, alpa: dict | None) -> dict:
    """Fig. 13: each model against §9.5's comparator for it where the JSON has it (AlpaServe
    for WHISPER-9B and OPT-66B), else against ServerlessLLM (as the row read before)."""
    vs_sllm = {m: v["improvement_vs_serverlessllm"] for m, v in f13["models"].items()}
    imp = dict(vs_sllm)
    for m, v in (alpa or {}).items():
        imp[m] = v["improvement_vs_alpaserve"]
    imp = {m: imp[m] for m in FIG13_PAPER if m in imp}
    mean = sum(imp.values()) / len(imp)
    pairs = ", ".join(
        f"{m} ({FIG13_PAPER[m][0]}) vs {FIG13_PAPER[m][1] if alpa else 'ServerlessLLM'} "
        f"{v:+.1%} (paper {FIG13_PAPER[m][2]:.2%})"
        for m, v in imp.items()
    )
    sllm_text = (
        "Against ServerlessLLM (LLAMA2-7B, BERT-21B): its first loads of each model come "
        "from SSD (its LRU host cache starts empty; FlexPipe keeps host copies, §7); with "
        "every load from host memory the three whole-model-capable models' mean "
        f"{f13['mean_improvement']:+.1%} -> {f13['mean_improvement_vs_host']:+.1%}."
    )
    alpa_text = ""
    if alpa:
        parts = []
        for m, v in alpa.items():
            parts.append(
                f"{m} {v['flexpipe_ttft_mean_s']:.3f} s vs {v['alpaserve_ttft_mean_s']:.3f} s "
                f"(AlpaServe's {v['alpaserve_stages']}-stage shape, {v['alpaserve_groups']} "
                f"groups of {v['alpaserve_gpus_peak'] // max(v['alpaserve_groups'], 1)} GPUs "
                f"held throughout; FlexPipe's peak {v['flexpipe_gpus_peak']} GPUs; FlexPipe "
                "spreading requests instead of packing them "
                f"{v['flexpipe_spread_ttft_mean_s']:.3f} s)"
            )
        alpa_text = (
            " Against AlpaServe (WHISPER-9B, OPT-66B; §9.5 names it for these two), as "
            "Fig. 8 deploys it (each shape's peak groups in the autoscaled run on the same "
            "trace, held; the shape of lowest mean TTFT; OPT-66B's 1-stage shape falls back "
            "to one-GPU stages as in Fig. 8): mean TTFT "
            + "; ".join(parts)
            + ". AlpaServe holds its peak and never cold-starts; FlexPipe packs requests on "
            "the groups it holds (packing is part of the OPT-66B gap, see the spread "
            "numbers), the rest goes with its fewer GPUs (30% of its peak kept, §9.1). "
            "Before this pairing (every model vs ServerlessLLM, OPT-66B not run) the row "
            f"read {f13['mean_improvement']:+.1%}."
        )
    return row(
        PAPER,
        "Fig. 13",
        "production trace (prefill latency, 4 models): 6.43-24.38% lower, 17.32% on average",
        "17.32%",
        f"mean TTFT per model against §9.5's comparator for it, Alibaba GenTD26 busiest 6 h: "
        f"{pairs}; mean {mean:+.1%}",
        ordering=min(imp.values()) > 0,
        reductions=((mean, 0.1732),),
        cause=sllm_text
        + alpa_text
        + " The six hours are replayed 36x faster (§9.5 gives no rate); at the trace's own "
        "rate (a request every ~14 s on average) FlexPipe vs ServerlessLLM "
        + (
            f"{f13['mean_improvement_own_rate']:+.1%}"
            if "mean_improvement_own_rate" in f13
            else "not run"
        )
        + ": FlexPipe's groups stay 5 idle minutes and 30% of its peak until the pool idles "
        "15 minutes (§9.1, §9.4; the lapse is surge's), "
        "ServerlessLLM's instances go after 10 s idle (unsourced) and load again.",
    )
