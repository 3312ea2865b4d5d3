"""REPORT.md rows of paraserve_eval.py's JSON: §8.3 SLO attainment, §8.4 scale-down and
scale-up, §8.5 brownfield, each miss with the counterfactual that script measured.

In: benchmarks/results/paper/paraserve_eval.json. Out: `rows.row` dicts for `report.py`.
"""

from rows import row

PAPER = "ParaServe"


def report_rows(doc: dict) -> list[dict]:
    e2e, down, up, brown = doc["e2e"], doc["scale_down"], doc["scale_up"], doc["brownfield"]
    holds = all(r["ratio_vs_best_baseline"] > 1 for r in e2e["rows"])
    start = [
        v["paraserve_ratio"]
        for r in e2e["rows"]
        for v in r.get("serverlessllm_start_sensitivity", {}).values()
    ]
    containers = brown.get("counterfactual_container_s", {})
    pulled = brown["systems"].get(f"serverless-vllm-container{list(containers)[-1]}", {})
    pulled_vllm = f"{pulled['ttft_mean_s']:.0f} s" if pulled else "n/a"
    return [
        row(
            PAPER,
            "§8.3 Fig. 11",
            "TTFT SLO attainment over the baselines (384 models, testbed ii): up to 1.74x",
            "1.74x",
            f"up to {e2e['max_ratio_vs_best_baseline']:.2f}x over the best baseline, "
            f"{e2e['max_ratio_vs_any_baseline']:.2f}x over any; with S-LLM's engine start "
            "0.5 s after / 4.0 s beside its load, worst point "
            + (f"{min(start):.2f}x" if start else "not run"),
            ordering=holds,
            sim_value=e2e["max_ratio_vs_best_baseline"],
            paper_value=1.74,
            cause=None
            if not start or min(start) > 1
            else "The ordering at 1.2 and 2.4 req/s rests on S-LLM's 6.8-s engine start "
            "beside its load (a lower bound from §8.2): with other starts it misses there.",
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
            f"{brown['ttft_ratio']:.2f}x",
            ordering=brown["ttft_ratio"] > 1,
            sim_value=brown["ttft_ratio"],
            paper_value=2.6,
            cause="Production functions create a container before anything else, and §8.5 "
            "deploys ParaServe's parameter manager but no prefetcher, so nothing overlaps "
            "it; the simulator models no container. Counterfactual: a container creation "
            "of "
            + ", ".join(f"{c} s -> {v:.2f}x" for c, v in containers.items())
            + f" (from {brown['ttft_ratio']:.2f}x; paper 2.6x; the paper gives no time; "
            "the last is the 8.31-GB vLLM image of §5 pulled at §8.5's 5 Gb/s, which puts "
            f"serverless vLLM's cold start at {pulled_vllm}, Fig. 1's 'up to 40 seconds' "
            "for 7B in production).",
        ),
    ]


def _scale_down_cause(down: dict) -> str:
    whole = down["counterfactual_whole_gpus"]
    hops = down["counterfactual_stage_hop_s"]
    sys = down["systems"]
    return (
        "As the paper deploys it: §8.4 sets only the group size, so each of the 4 workers "
        "holds its part's share of a V100 and with it a quarter of the compute quota "
        "(§4.1.1's default), and the consolidated 13B runs on one V100 (§8.1). Eq. 2 slows "
        "each low-memory stage's step 4x (t_d per stage); the paper's measured slowdown "
        "(Fig. 5b) is not given in numbers: without consolidation the group decodes 512 "
        f"tokens in {sys['none']['generation_s']:.0f} s, with it "
        f"{sys['predictor']['generation_s']:.0f} s. Counterfactuals: whole V100s (the "
        f"model before) {whole['generation_ratio']:.2f}x; quarter quotas with the two-V100 "
        "worker our fit rule gives 13B "
        f"{down['counterfactual_quarter_quota_two_cards']:.2f}x; on whole V100s the stage "
        "hop (1 ms here; the paper's crosses 16 Gb/s TCP, §4.1 t_n) "
        + ", ".join(f"{h} s -> {v:.2f}x" for h, v in hops.items())
        + "."
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
        "server's one 16-Gb/s NIC: the 16 one-card workers each fetch all 26 GB, four per "
        f"server (every first token at {one['ttft_first_s']:.1f} s), the 4-worker groups "
        "a quarter each, 26 GB per server in all (first tokens "
        f"{four['ttft_first_s']:.1f}-{four['ttft_last_s']:.1f} s, 4 micro-batches of 8 "
        "per group). Counterfactuals: each server's prefetcher (§5.1) fetching the model "
        "once for its four one-card workers, which the paper does not state: "
        f"{shared['ttft_ratio']:.2f}x (first tokens {shared['workers1']['ttft_first_s']:.1f}"
        " s: both sides fetch 26 GB per server); 13B on the two V100s our fit rule gives "
        f"it: {two['ttft_ratio']:.2f}x (8 instances of 8: first tokens "
        f"{two['workers1']['ttft_first_s']:.1f} s, the second 64 after a whole 512-token "
        f"generation, {two['workers1']['ttft_last_s']:.1f} s). The paper's 1.87x lies "
        "between one fetch per server and one per worker. Before the simulator admitted "
        "KV by prompt (699684f) one V100 gave 4.36x: only 4 of a worker's 8 sequences "
        "were admitted. TPOT: the one-card worker's preemptions (recomputing) make its "
        f"steps the slower ({one['tpot_mean_s'] * 1e3:.0f} vs "
        f"{four['tpot_mean_s'] * 1e3:.0f} ms)."
    )
