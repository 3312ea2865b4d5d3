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
    hops = down.get("counterfactual_stage_hop_s", {})
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
            f"{down['generation_ratio']:.2f}x",
            ordering=down["generation_ratio"] > 1,
            sim_value=down["generation_ratio"],
            paper_value=2.29,
            cause="The 4 workers run here on whole V100s; the paper's, by default, hold GPU "
            "memory in proportion to their part, and with it their compute quota (§4.1.1), "
            "but how much slower that makes decoding it does not say (Fig. 5b). "
            "Counterfactuals: each worker at a quarter of a GPU's compute -> "
            f"{down.get('counterfactual_quarter_quota', float('nan')):.2f}x; the stage hop "
            "(1 ms per stage per token here; the paper's crosses 16 Gb/s TCP, §4.1 t_n) "
            + ", ".join(f"{h} s -> {v:.2f}x" for h, v in hops.items())
            + f" (from {down['generation_ratio']:.2f}x; paper 2.29x, between the two). "
            "Both as the paper deploys them, quarter quotas (§4.1.1's default, Eq. 2's "
            "t_d per low-memory stage) and the consolidated 13B on one V100 (§8.1: every "
            "model resides in a single card; our fit rule needs two): "
            f"{down.get('counterfactual_quarter_quota_one_card', float('nan')):.2f}x, "
            "Eq. 2's linear quota slowing each stage 4x where the paper's measured "
            "slowdown (Fig. 5b) is not given.",
        ),
        row(
            PAPER,
            "§8.4 Fig. 14",
            "scale-up: mean TTFT 1 worker / 4 workers under a burst (128 requests): 1.87x; "
            "TPOT 1.08-1.19x",
            "1.87x",
            f"TTFT {up['ttft_ratio']:.2f}x, TPOT {up['tpot_ratio']:.2f}x",
            ordering=up["ttft_ratio"] > 1,
            sim_value=up["ttft_ratio"],
            paper_value=1.87,
            cause=None
            if "counterfactual_one_card" not in up
            else "Judged on the TTFT headline (abstract, §8); the TPOT is not within 20%: "
            "13B runs here on two V100s (our fit rule; §8.1 puts every model on one card), "
            "so the 1-worker baseline decodes at tensor parallel 2. Counterfactual, 13B on "
            f"one V100: TPOT {up['counterfactual_one_card']['tpot_ratio']:.2f}x, but TTFT "
            f"{up['counterfactual_one_card']['ttft_ratio']:.2f}x (16 one-GPU workers fetch "
            "the whole model through each server's one 16-Gb/s NIC).",
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
