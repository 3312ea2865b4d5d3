"""REPORT.md rows of paraserve_eval.py's JSON: §8.3 SLO attainment, §8.4 scale-down and
scale-up, §8.5 brownfield, each miss with the counterfactual that script measured.

In: benchmarks/results/paper/paraserve_eval.json. Out: `rows.row` dicts for `report.py`.
"""

from rows import row

PAPER = "ParaServe"


def report_rows(doc: dict) -> list[dict]:
    e2e, down, up, brown = doc["e2e"], doc["scale_down"], doc["scale_up"], doc["brownfield"]
    holds = all(r["ratio_vs_best_baseline"] > 1 for r in e2e["rows"])
    return [
        row(
            PAPER,
            # §8.3: "Figure 10 demonstrates the TTFT SLO attainment of the systems under
            # different CVs ... achieving up to 1.74× higher compared to baselines in all
            # scenarios" (the CV x RPS grid run here); Fig. 11 is the SLO-scale sweep (1.52×)
            "§8.3 Fig. 10",
            "TTFT SLO attainment over the baselines (384 models, testbed ii): up to 1.74x",
            "1.74x",
            f"up to {e2e['max_ratio_vs_best_baseline']:.2f}x over the best baseline, "
            f"{e2e['max_ratio_vs_any_baseline']:.2f}x over any; "
            + _start_text(e2e, doc.get("sllm_start_check")),
            ordering=holds,
            sim_value=e2e["max_ratio_vs_best_baseline"],
            paper_value=1.74,
            cause=start_cause(e2e, doc.get("sllm_start_check")),
        ),
        row(
            PAPER,
            "§8.4 Fig. 13",
            "scale-down: generation time without / with consolidation (13B, 512 tokens): 2.29x",
            "2.29x",
            f"{down['generation_ratio']:.2f}x (quarter-quota workers, 13B on one V100); "
            f"whole V100s {down['counterfactual_whole_gpus']['generation_ratio']:.2f}x",
            ordering=down["generation_ratio"] > 1,
            sim_value=down["generation_ratio"],
            paper_value=2.29,
            cause=_scale_down_cause(down),
        ),
        row(
            PAPER,
            "§8.4 Fig. 14",
            "scale-up: mean TTFT 1 worker / 4 workers under a burst (128 requests): 1.87x; "
            "TPOT 1.08-1.19x",
            "1.87x",
            f"TTFT {up['ttft_ratio']:.2f}x, TPOT {up['tpot_ratio']:.2f}x (13B on one V100); "
            f"on two V100s {up['counterfactual_two_cards']['ttft_ratio']:.2f}x",
            ordering=up["ttft_ratio"] > 1,
            sim_value=up["ttft_ratio"],
            paper_value=1.87,
            cause=_scale_up_cause(up),
        ),
        row(
            PAPER,
            "§8.5 Fig. 15",
            "brownfield (7B, A10, 5 Gb/s): mean cold-start TTFT 2.6x below serverless vLLM",
            "2.6x",
            f"{brown['ttft_ratio']:.2f}x (no node prefetcher, as §8.5 deploys it)",
            ordering=brown["ttft_ratio"] > 1,
            sim_value=brown["ttft_ratio"],
            paper_value=2.6,
            cause=_brownfield_cause(brown),
        ),
    ]


def start_split(e2e: dict, check: dict | None) -> tuple[dict, dict]:
    """Worst ParaServe / S-LLM ratio over the §8.3 points per S-LLM start, split into the
    starts §8.2's sentence allows and those it rules out (all allowed without the check)."""
    # the scenario's own start (6.8 s beside the load) is the headline run's S-LLM
    worst: dict[str, float] = {"6.8s_beside": min(r["ratio_vs_serverlessllm"] for r in e2e["rows"])}
    for r in e2e["rows"]:
        for label, v in r.get("serverlessllm_start_sensitivity", {}).items():
            worst[label] = min(worst.get(label, v["paraserve_ratio"]), v["paraserve_ratio"])
    allowed = check["allowed_by_8_2"] if check else {}
    ok = {k: v for k, v in worst.items() if allowed.get(k, True)}
    return ok, {k: v for k, v in worst.items() if k not in ok}


def _label(start: str) -> str:
    """`6.8s_beside` as `6.8 s beside`."""
    return start.replace("s_", " s ")


def _start_text(e2e: dict, check: dict | None) -> str:
    ok, ruled_out = start_split(e2e, check)
    if not ok and not ruled_out:
        return "S-LLM start sensitivity not run"
    parts = [f"{_label(k)} {v:.2f}x" for k, v in {**ok, **ruled_out}.items()]
    return "worst point with S-LLM's engine start " + ", ".join(parts)


def start_cause(e2e: dict, check: dict | None) -> str | None:
    """The §8.3 row's cause where its ordering rests on S-LLM's engine start (None: it
    does not): the allowed starts it misses with, else those §8.2's sentence rules out."""
    ok, ruled_out = start_split(e2e, check)
    allowed_misses = {k: v for k, v in ok.items() if v <= 1}
    if allowed_misses:
        return (
            "The ordering rests on S-LLM's engine start: it misses with "
            + ", ".join(f"{_label(k)} ({v:.2f}x)" for k, v in allowed_misses.items())
            + (", a start §8.2's text allows." if check else ".")
        )
    misses = {k: v for k, v in ruled_out.items() if v <= 1}
    if not misses or check is None:
        return None
    seven = check["llama2-7b_A10"]
    cached = seven["serverlessllm_cached_ttft_s"]
    top = max(
        v["paraserve_ratio"]
        for r in e2e["rows"]
        for k, v in r["serverlessllm_start_sensitivity"].items()
        if k in ok
    )
    points = [
        f"{r['rate_rps']:g} req/s CV {r['cv']:g}"
        for r in e2e["rows"]
        if any(
            v["paraserve_ratio"] <= 1
            for k, v in r.get("serverlessllm_start_sensitivity", {}).items()
            if k in ruled_out
        )
    ]
    return (
        "Holds at every S-LLM start §8.2's text allows; the ordering misses (at "
        + ", ".join(points)
        + ") only with starts it rules out ("
        + ", ".join(f"{_label(k)}: {v:.2f}x" for k, v in misses.items())
        + "): with them S-LLM's cached 7B cold start ("
        + " / ".join(f"{cached[k]:.2f} s" for k in misses)
        + ") beats ParaServe's single worker "
        f"({seven['paraserve_one_worker_ttft_s']:.2f} s, testbed i, A10), where §8.2 says "
        "'For smaller models, such as OPT-6.7B, ParaServe with single worker even achieves "
        "a short cold start latency than ServerlessLLM with cached models'. At the starts it "
        "allows ("
        + ", ".join(
            f"{_label(k)}: cached {cached[k]:.2f} s, worst {ok[k]:.2f}x" for k in ok if k in cached
        )
        + f") the ratio grows with the start (up to {top:.2f}x), so the headline's "
        f"{e2e['max_ratio_vs_best_baseline']:.2f}x is at §8.2's lower bound (6.8 s)."
    )


def _scale_down_cause(down: dict) -> str:
    whole = down["counterfactual_whole_gpus"]
    hops = down["counterfactual_stage_hop_s"]
    sys = down["systems"]
    tpot = down.get("v100_tpot_s")
    table1 = (
        f" The V100 decodes at Table 1's warm TPOT ({tpot['simulated'] * 1e3:.0f} ms at "
        "batch 8; the roofline's 49 ms gave 2.79x): a slower step widens Eq. 2's 4x gap, "
        "so the simulator's speed is not the overshoot."
        if tpot
        else ""
    )
    return (
        "As the paper deploys it: §8.4 sets only the group size, so each of the 4 workers "
        "holds its part's share of a V100 and with it a quarter of the compute quota "
        "(§4.1.1: workers 'allocate GPU memory proportionally to their partitioned model "
        "size by default, and the amount of allocated memory also determines the GPU "
        "computation quota'), and the consolidated 13B runs on one V100 (§8.1). Each "
        "low-memory stage's step takes t_d (Eq. 2: TPOT = t_d (s - w + w/s) + t_n s, 4 t_d "
        "here); the paper's measured slowdown (Fig. 5b) is not in its text: without "
        f"consolidation the group decodes 512 tokens in {sys['none']['generation_s']:.0f} s, "
        f"with it {sys['predictor']['generation_s']:.0f} s."
        + table1
        + " Counterfactuals: whole V100s "
        f"(the model before) {whole['generation_ratio']:.2f}x; quarter quotas with the "
        "two-V100 worker our fit rule gives 13B "
        f"{down['counterfactual_quarter_quota_two_cards']:.2f}x"
        "; on whole V100s the stage hop (1 ms here; the paper's crosses 16 Gb/s TCP, §4.1 "
        "t_n) "
        + ", ".join(f"{h} s -> {v:.2f}x" for h, v in hops.items())
        + ". Left: Eq. 2's linear quota against the paper's measured one."
    )


def _scale_up_cause(up: dict) -> str:
    one, four = up["systems"]["workers1"], up["systems"]["workers4"]
    two, shared = up["counterfactual_two_cards"], up["counterfactual_one_card_shared_fetch"]
    return (
        "Judged on the TTFT headline (abstract, §8), as the paper deploys it: 13B on one "
        "V100 (§8.1; §8.4: 128 requests at batch 8 are 'the maximum load for 16 V100 "
        "GPUs'), KV admitted by prompt as vLLM does (beside the weights one V100 holds "
        f"{up['one_card_kv_tokens']} KV tokens: a worker's 8 prompts fit, their outputs "
        "are preempted and recomputed as the cache fills). Both sides are bound by each "
        "server's one 16-Gb/s NIC (§8.1: 'four NVIDIA V100 GPUs' per server, 'The network "
        "bandwidth per server is 16Gbps'): the 16 one-card workers each fetch all 26 GB, "
        f"four per server (every first token at {one['ttft_first_s']:.1f} s), the 4-worker "
        "groups a quarter each, 26 GB per server in all (first tokens "
        f"{four['ttft_first_s']:.1f}-{four['ttft_last_s']:.1f} s, 4 micro-batches of 8 "
        "per group). One fetch per worker is the paper's design: §4.2 'Cold-start workers "
        "that collocated on a GPU server will compete for network resources during model "
        "fetching' (Alg. 2 keeps each one's pending bytes S_i at a share B/N), §5.1's "
        "prefetcher serves each 'fetching request', and Fig. 7's concurrent workers cost "
        "'significant network and memory consumption'. Counterfactuals: each server's "
        "prefetcher fetching the model once for its four one-card workers, which the paper "
        f"does not state: {shared['ttft_ratio']:.2f}x (first tokens "
        f"{shared['workers1']['ttft_first_s']:.1f} s: both sides fetch 26 GB per server); "
        f"13B on the two V100s our fit rule gives it: {two['ttft_ratio']:.2f}x (8 "
        f"instances of 8: first tokens {two['workers1']['ttft_first_s']:.1f} s, the second "
        f"64 after a whole 512-token generation, {two['workers1']['ttft_last_s']:.1f} s). "
        "The paper's 1.87x lies between one fetch per server and one per worker. Not "
        "modelled: Alg. 2 refusing a second 26-GB fetch on a server whose first would "
        "then miss its deadline (§8.4 states no SLO, nor what the controller does when "
        "no server passes Eq. 3; the simulator's fixed groups are placed without Alg. 2). "
        + _tpot_text(up)
        + "."
    )


def _tpot_text(up: dict) -> str:
    one, four = up["systems"]["workers1"], up["systems"]["workers4"]
    slower = "the one-card worker's preemptions (recomputing) make its steps the slower"
    if up["tpot_ratio"] >= 1:
        slower = "the 4-worker group's steps are the slower, as in the paper"
    return (
        f"TPOT 4 / 1 {up['tpot_ratio']:.2f}x (paper 1.08-1.19x): {slower} "
        f"({one['tpot_mean_s'] * 1e3:.0f} ms one-card vs {four['tpot_mean_s'] * 1e3:.0f} ms "
        "4-worker)"
    )


def _brownfield_cause(brown: dict) -> str:
    containers = brown.get("counterfactual_container_s", {})
    systems = brown["systems"]
    pulled = systems.get(f"serverless-vllm-container{list(containers)[-1]}", {})
    pulled_vllm = f"{pulled['ttft_mean_s']:.0f} s" if pulled else "n/a"
    hops = brown.get("counterfactual_shared_object_hop_s", {})
    prefetch = brown.get("counterfactual_prefetcher")
    slos = brown.get("counterfactual_alg1_slo", {})
    sized = (
        "§8.5 states no SLO, and Alg. 1 sizes the group by one: at Table 2's 7B chatbot "
        f"SLOs (7.5 s, 0.2 s; the headline) {systems['paraserve'].get('first_workers')} "
        f"workers {brown['ttft_ratio']:.2f}x, "
        + ", ".join(
            f"at its {app} SLOs ({v['ttft_s']:g} s, {v['tpot_s']:g} s) {v['workers']} "
            f"workers {v['ttft_ratio']:.2f}x"
            for app, v in slos.items()
        )
        + ". "
        if slos
        else ""
    )
    return (
        sized + "§8.5 deploys 'the parameter manager and engine optimizations' in production "
        "functions, not §5.1's per-server prefetcher, so ParaServe's start-up follows its "
        f"fetch ({systems['paraserve']['ttft_mean_s']:.1f} vs "
        f"{systems['serverless-vllm']['ttft_mean_s']:.1f} s"
        + (f"; with the prefetcher {prefetch:.2f}x" if prefetch else "")
        + "), and a production cold start begins with container creation (§2.2: "
        "'Container creation also costs a considerable amount of time, as LLM workloads "
        "require large function images'), which nothing overlaps; the simulator models "
        "none, the paper gives no time and does not say §8.5's functions pull their image "
        "or at what bandwidth. Counterfactual container creation: "
        + ", ".join(f"{c} s -> {v:.2f}x" for c, v in containers.items())
        + " (the last: the 8.31-GB vLLM image of §5 at §8.5's 5 Gb/s per function, which "
        f"puts serverless vLLM's cold start at {pulled_vllm}, Fig. 1's 'up to 40 seconds' "
        "for 7B in production). Not the shared-object hop ('functions cannot establish "
        "direct TCP connections', no latency given): 4 workers at "
        + ", ".join(f"{h} s -> {v['four_workers']:.2f}x" for h, v in hops.items())
        + "; with Alg. 1 sizing, at these hops no group meets Table 2's 7B chatbot SLOs "
        "(7.5 s, 0.2 s; t_n per stage in Eq. 1 and 2) and it falls back to one worker ("
        + ", ".join(f"{h} s -> {v['alg1']:.2f}x" for h, v in hops.items())
        + "; §8.5 states no SLO)."
    )
